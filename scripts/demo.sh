#!/usr/bin/env bash
# The service in one go: build, start `forge-cache serve` on the defaults (default model,
# ./forge.db, 127.0.0.1:50051, CPU) in the background, wait until grpc.health.v1 says SERVING,
# ask the same question twice over gRPC (the first answer is computed by the model, the repeat
# comes from the exact cache), print `forge-cache stats`, stop the service.
# The database persists: run it again and both answers come from the cache.
# FORGE_ADDR, FORGE_HTTP_ADDR (the OpenAI-compatible API, default 127.0.0.1:8080) and FORGE_DB
# override the addresses and the database.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ADDR="${FORGE_ADDR:-127.0.0.1:50051}"
HTTP_ADDR="${FORGE_HTTP_ADDR:-127.0.0.1:8080}"
DB="${FORGE_DB:-forge.db}"
cargo build --release --quiet
BIN="${CARGO_TARGET_DIR:-target}/release/forge-cache"

"$BIN" serve --addr "$ADDR" --http-addr "$HTTP_ADDR" --db "$DB" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
"$BIN" health --server "http://$ADDR" --wait 120 >/dev/null

ASK=(generate --server "http://$ADDR" --system "You are a helpful assistant." --prompt "What is the capital of France?")
echo "== Generate"
"$BIN" "${ASK[@]}"
echo "== the same request again"
"$BIN" "${ASK[@]}"
echo "== forge-cache stats --db $DB"
"$BIN" stats --db "$DB"
