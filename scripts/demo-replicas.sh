#!/usr/bin/env bash
# Two replicas, one database: starts a throw-away PostgreSQL + pgvector (scripts/pg-test-server.sh,
# fetched by scripts/fetch-postgres.sh), two `forge-cache serve --db postgres://...` processes on
# their own ports, asks replica A a question (computed by the model), asks replica B the same
# question (served EXACT from A's answer, 0 tokens computed) and a fact put on A (FACT on B), then
# prints `forge-cache stats --db postgres://...`, which counts both replicas' requests.
# Everything is stopped and the database deleted at the end. FORGE_ADDR_A / FORGE_ADDR_B override
# the gRPC addresses (default 127.0.0.1:50061 and :50062); the HTTP APIs are off.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

A="${FORGE_ADDR_A:-127.0.0.1:50061}"
B="${FORGE_ADDR_B:-127.0.0.1:50062}"
scripts/fetch-postgres.sh >/dev/null
cargo build --release --quiet
BIN="${CARGO_TARGET_DIR:-target}/release/forge-cache"

PGDIR="$(mktemp -d "${TMPDIR:-/tmp}/forge-demo-pg.XXXXXX")"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  scripts/pg-test-server.sh stop "$PGDIR" 2>/dev/null || true
}
trap cleanup EXIT
URL="$(scripts/pg-test-server.sh start "$PGDIR" 2>/dev/null)"
echo "== PostgreSQL + pgvector at $URL"

"$BIN" serve --addr "$A" --no-http --db "$URL" 2>"$PGDIR/replica-a.log" &
PIDS+=($!)
"$BIN" serve --addr "$B" --no-http --db "$URL" 2>"$PGDIR/replica-b.log" &
PIDS+=($!)
"$BIN" health --server "http://$A" --wait 180 >/dev/null
"$BIN" health --server "http://$B" --wait 180 >/dev/null
echo "== replicas A ($A) and B ($B) serving"

ASK=(--system "You are a helpful assistant." --prompt "What is the capital of France?")
echo "== replica A: Generate"
"$BIN" generate --server "http://$A" "${ASK[@]}"
echo "== replica B: the same request"
"$BIN" generate --server "http://$B" "${ASK[@]}"

if [[ -x .test-clients/bin/grpcurl ]]; then
  echo "== replica A: PutFact; replica B: the fact's question"
  .test-clients/bin/grpcurl -plaintext -d '{"content": "The clinic opens at 9 and closes at 5.", "question": "When is the clinic open?"}' \
    "$A" forge.v1.Forge/PutFact >/dev/null
  "$BIN" generate --server "http://$B" --system "You are a helpful assistant." --prompt "When is the clinic open?"
fi

echo "== forge-cache stats --db $URL (both replicas' requests)"
"$BIN" stats --db "$URL"
