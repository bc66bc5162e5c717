#!/bin/bash
# VERIFIED vs BYPASS on QQP pairs with the semantic tier alone (--no-kv-reuse), interleaved
# (docs/perf.md, issue 22). Usage: scripts/qqp-verified-ab.sh OUT_DIR [extra serve flags...]
# Writes OUT_DIR/{verified.jsonl,run.db,serve.log,load,ab.out,ab.json,report/}.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FORGE_BIN:-$root/target/release/forge-cache}
out=$1; shift
mkdir -p "$out"; cd "$out"
[ -f verified.jsonl ] || "$bin" ab --make-workload qqp -o verified.jsonl --requests "${REQUESTS:-400}" --offset 1200 --max-tokens 32
rm -f run.db run.db-*
port=$((50300 + RANDOM % 400))
"$bin" serve --db run.db --threads 2 --no-http --addr 127.0.0.1:$port --no-kv-reuse "$@" > serve.log 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null || true; kill $load 2>/dev/null || true' EXIT
sleep 8
(while sleep 30; do uptime; done) > load & load=$!
"$bin" ab --server http://127.0.0.1:$port --workload verified.jsonl --mode verified --interleave --json ab.json --out report > ab.out 2>&1
cat ab.out
echo "load average (1 min) min/max: $(awk '{print $(NF-2)}' load | tr -d , | sort -n | sed -n '1p;$p' | tr '\n' ' ')"
python3 "$root/scripts/paired-latency.py" serve.log
