#!/usr/bin/env bash
# Hit rate of a Zipf workload (`forge-cache ab --make-workload zipf`) sent round-robin to replicas:
#   1 replica on PostgreSQL | 2 replicas on one PostgreSQL | 2 replicas with a SQLite file each.
# Each setup starts fresh (new database, new processes), runs the same workload once (cache on,
# `ab --skip-off`, mode verified) and prints its hit rate (requests not served by the model alone).
# REQUESTS (default 200), MAX_TOKENS (8), DISTINCT (25) shape the workload.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REQUESTS="${REQUESTS:-200}"; MAX_TOKENS="${MAX_TOKENS:-8}"; DISTINCT="${DISTINCT:-25}"
scripts/fetch-postgres.sh >/dev/null
cargo build --release --quiet
BIN="${CARGO_TARGET_DIR:-target}/release/forge-cache"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/forge-zipf.XXXXXX")"
PIDS=(); PGDIRS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
  for d in "${PGDIRS[@]}"; do scripts/pg-test-server.sh stop "$d" 2>/dev/null || true; done
  PGDIRS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT
"$BIN" ab --make-workload zipf --requests "$REQUESTS" --max-tokens "$MAX_TOKENS" --distinct "$DISTINCT" -o "$WORK/zipf.jsonl" 2>/dev/null

serve() { # serve NAME PORT DB
  "$BIN" serve --addr "127.0.0.1:$2" --no-http --db "$3" 2>"$WORK/$1.log" &
  PIDS+=($!)
}
run() { # run LABEL SERVERS
  local servers="$2" s
  for s in ${servers//,/ }; do "$BIN" health --server "http://$s" --wait 300 >/dev/null; done
  "$BIN" ab --server "$servers" --workload "$WORK/zipf.jsonl" --skip-off --out "$WORK/report-$1" --json "$WORK/$1.json" >/dev/null 2>&1
  python3 - "$WORK/$1.json" "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
tiers = {}
for q in r["requests"]:
    tiers[q["served_from_on"]] = tiers.get(q["served_from_on"], 0) + 1
n = len(r["requests"]); hits = n - tiers.get("MODEL", 0); exact = tiers.get("EXACT", 0)
print(f"{sys.argv[2]:<28} hit rate {100.0 * hits / n:5.1f}% (EXACT {100.0 * exact / n:5.1f}%)  {dict(sorted(tiers.items()))}  failed {r['failed']}")
PY
  stop_all
}

D="$(mktemp -d "${TMPDIR:-/tmp}/forge-zipf-pg.XXXXXX")"; PGDIRS+=("$D"); URL="$(scripts/pg-test-server.sh start "$D" 2>/dev/null)"
serve a 50071 "$URL"; run "1 replica, PostgreSQL" 127.0.0.1:50071
D="$(mktemp -d "${TMPDIR:-/tmp}/forge-zipf-pg.XXXXXX")"; PGDIRS+=("$D"); URL="$(scripts/pg-test-server.sh start "$D" 2>/dev/null)"
serve a 50071 "$URL"; serve b 50072 "$URL"; run "2 replicas, one PostgreSQL" 127.0.0.1:50071,127.0.0.1:50072
serve a 50071 "$WORK/a.db"; serve b 50072 "$WORK/b.db"; run "2 replicas, SQLite each" 127.0.0.1:50071,127.0.0.1:50072
