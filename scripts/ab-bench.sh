#!/usr/bin/env bash
# The semantic-cache measurements of docs/perf.md, end to end against a real service:
#   1. Zipf-repeated questions (500 requests): cache off vs VERIFIED (requests/s ratio)
#   2. QQP pairs: cache off vs VERIFIED (identical texts, requests/s)
#   3. TRUST: calibrate on QQP pairs (VERIFIED, one tenant), then TRUST on disjoint pairs
#   4. TRUST with a loose bound (--trust-delta 0.5): latency of semantic hits served over gRPC
# Usage: scripts/ab-bench.sh [OUT_DIR]   (FORGE_BIN, DATA, QQP_PAIRS, CAL_PAIRS override)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-ab-results}
BIN=${FORGE_BIN:-target/release/forge-cache}
DATA=${DATA:-../shared/data}
QQP=${QQP_PAIRS:-100}     # pairs in the QQP A/B run
CAL=${CAL_PAIRS:-300}     # pairs used to calibrate TRUST
mkdir -p "$OUT"
[ -x "$BIN" ] || cargo build --release
PORT=50091
SERVER=""
start() { # $1 = db, rest = serve flags
  local db=$1; shift
  rm -f "$db" "$db-wal" "$db-shm"
  "$BIN" serve --db "$db" --addr 127.0.0.1:$PORT "$@" >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  "$BIN" health --server http://127.0.0.1:$PORT --wait 60 >/dev/null
}
stop() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true; }
trap stop EXIT
ab() { "$BIN" ab --server http://127.0.0.1:$PORT "$@"; }

"$BIN" ab --make-workload zipf --data "$DATA" --requests 500 --max-tokens 48 -o "$OUT/zipf.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * QQP)) --max-tokens 32 -o "$OUT/qqp.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * CAL)) --offset $QQP --max-tokens 32 -o "$OUT/qqp-cal.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * QQP)) --offset $((QQP + CAL)) --max-tokens 32 -o "$OUT/qqp-trust.jsonl"

start "$OUT/zipf.db"
echo "== zipf: cache off vs verified"; ab --workload "$OUT/zipf.jsonl" --mode verified --json "$OUT/zipf.json" --out "$OUT/zipf"
stop

start "$OUT/qqp.db"
echo "== qqp: cache off vs verified"; ab --workload "$OUT/qqp.jsonl" --mode verified --json "$OUT/qqp.json" --out "$OUT/qqp"
stop

start "$OUT/trust.db"
echo "== trust: calibration (verified, tenant qqp-trust, no off arm)"
ab --workload "$OUT/qqp-cal.jsonl" --mode verified --skip-off --on-tenant qqp-trust --json "$OUT/trust-cal.json" --out "$OUT/trust-cal"
echo "== trust: disjoint pairs, cache off vs trust"
ab --workload "$OUT/qqp-trust.jsonl" --mode trust --on-tenant qqp-trust --json "$OUT/trust.json" --out "$OUT/trust"
"$BIN" stats --db "$OUT/trust.db" --tenant qqp-trust | tail -2
stop

# Each question, then the same question lower-cased: near-certain paraphrases, so TRUST learns
# quickly and serves; this run measures what a served semantic hit costs, nothing else.
python3 - "$OUT/qqp-cal.jsonl" "$OUT/lower.jsonl" <<'PY'
import json, sys
out = open(sys.argv[2], "w")
for i, line in enumerate(open(sys.argv[1])):
    q = json.loads(line)
    if i % 2 or i >= 400:
        continue
    out.write(json.dumps(q) + "\n")
    q["prompt"] = q["prompt"].lower()
    out.write(json.dumps(q) + "\n")
PY
start "$OUT/loose.db" --trust-delta 0.5
echo "== semantic hit latency (TRUST, --trust-delta 0.5, so answers may be wrong: latency only)"
ab --workload "$OUT/lower.jsonl" --mode trust --skip-off --on-tenant loose --json "$OUT/loose.json" --out "$OUT/loose"
python3 - "$OUT/loose.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
lat = sorted(q["latency_ms_on"] for q in r["requests"] if q["served_from_on"] == "TRUST")
if lat:
    print(f"TRUST hits: {len(lat)}, p50 {lat[len(lat)//2]:.2f} ms, p95 {lat[int(len(lat)*0.95)]:.2f} ms (client round trip)")
else:
    print("no TRUST hits")
PY
stop
