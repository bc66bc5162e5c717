#!/bin/bash
# EQUIVALENT on QQP (docs/perf.md, issue 22): calibration on 400 pairs with every candidate
# decoded (observations only, nothing served), the label-chosen bound of scripts/
# equivalent-features.py on them, then the disjoint test split (330 pairs) interleaved with BYPASS
# at --equivalent-delta (default 0.01) on the same store. Usage:
#   scripts/qqp-equivalent-eval.sh OUT_DIR [extra serve flags, e.g. --equivalent-prefix 8;
#   --model gemma3 (or a GGUF path) judges with another model: a fresh OUT_DIR per model]
# Writes OUT_DIR/{calib,test}.jsonl, eval.db, calib.out, features.out, test.out, load.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FORGE_BIN:-$root/target/release/forge-cache}
out=$1; shift
mkdir -p "$out"; cd "$out"
[ -f calib.jsonl ] || "$bin" ab --make-workload qqp -o calib.jsonl --requests 800 --offset 0 --max-tokens 32
[ -f test.jsonl ] || "$bin" ab --make-workload qqp -o test.jsonl --requests 660 --offset 400 --max-tokens 32
# A second run with CALIBRATED=1 keeps eval.db and runs only the test.
[ -n "${CALIBRATED:-}" ] || rm -f eval.db eval.db-* eval.db.kv
port=$((50300 + RANDOM % 400))
serve() {
  "$bin" serve --db eval.db --threads 2 --no-http --addr 127.0.0.1:$port "$@" >> serve.log 2>&1 & serve=$!
  "$bin" health --server http://127.0.0.1:$port --wait 120 > /dev/null
}
(while sleep 30; do uptime; done) > load & load=$!
trap 'kill $serve 2>/dev/null || true; kill $load 2>/dev/null || true' EXIT
if [ -z "${CALIBRATED:-}" ]; then
  serve --equivalent-explore 1.0 "$@"
  "$bin" ab --server http://127.0.0.1:$port --workload calib.jsonl --mode equivalent --skip-off --on-tenant qqp > calib.out 2>&1
  kill $serve; wait $serve 2>/dev/null || true
  python3 "$root/scripts/equivalent-features.py" eval.db calib.jsonl > features.out 2>&1 || true
fi
serve --equivalent-delta "${DELTA:-0.01}" "$@"
"$bin" ab --server http://127.0.0.1:$port --workload test.jsonl --mode equivalent --interleave --on-tenant qqp > test.out 2>&1
cat features.out test.out
echo "load average (1 min) min/max: $(awk '{print $(NF-2)}' load | tr -d , | sort -n | sed -n '1p;$p' | tr '\n' ' ')"
