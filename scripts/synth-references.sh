#!/usr/bin/env bash
# Makes llama.cpp's references for the synthetic models of every architecture the engine runs:
# for each (architecture, weight type, seed) below it writes the model with
# `forge-cache synth-model --arch A --quant Q --seed S`, then runs llama.cpp on it through
# ../shared/reference/llref.cpp (prompt token ids, greedy tokens, top-2 margins per step) and
# stores the results, with the sha256 of the model file, in tests/data/synth_references.jsonl.
# tests/synth_references.rs regenerates each model from its seed, checks the sha256, and compares.
#
# Needs llama.cpp built outside this repository (the source of the PyPI sdist
# llama-cpp-python==0.3.36, vendor/llama.cpp; see ../shared/reference/README.md):
#   LLAMA_CPP_DIR=/path/to/llama.cpp scripts/synth-references.sh
# ($LLAMA_CPP_DIR/build/bin holds libllama.so and the ggml libraries). Re-runnable: the output
# file is rewritten whole; models and llref are built in a temporary folder.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA="${LLAMA_CPP_DIR:?set LLAMA_CPP_DIR to a llama.cpp source tree built with cmake (build/bin)}"
LLREF_SRC="${LLREF_SRC:-$ROOT/../shared/reference/llref.cpp}"
OUT="${OUT:-$ROOT/tests/data/synth_references.jsonl}"
MAX_TOKENS="${MAX_TOKENS:-24}"
PYTHON="${PYTHON:-python3}"

# architecture, weight types, seed: every new type is checked against llama.cpp at least once.
MODELS=(
  "llama3 q8_0 11" "llama3 q3_k 12" "llama3 mxfp4 13"
  "qwen2 q4_k_m 21" "qwen2 q5_1 22" "qwen2 iq4_nl 23"
  "qwen3 q8_0 31" "qwen3 q5_k 32"
  "phi3 q4_0 41" "phi3 q2_k 42"
  "gemma3 q4_k_m 51" "gemma3 q6_k 52" "gemma3 q5_0 53"
)

# Prompts: plain text, digits and punctuation, non-ASCII (llref reads \uXXXX escapes of the
# BMP only), and the architecture's chat turn with its special tokens.
prompts_for() {
  cat <<'EOF'
"The capital of France is Paris, and the capital of Germany is"
"Numbers like 12, 345 and 6789 appear in text too. What is the answer?"
"Na\u00efve caf\u00e9 r\u00e9sum\u00e9: the weather today is sunny with a light breeze"
EOF
  case "$1" in
    llama3) echo '"<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"' ;;
    qwen2|qwen3) echo '"<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"' ;;
    phi3) echo '"<|user|>\nWhat is the capital of France?<|end|>\n<|assistant|>\n"' ;;
    gemma3) echo '"<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"' ;;
  esac
}

log() { echo "synth-references: $*" >&2; }

[[ -f "$LLREF_SRC" ]] || { log "error: $LLREF_SRC not found"; exit 1; }
[[ -f "$LLAMA/build/bin/libllama.so" ]] || { log "error: $LLAMA/build/bin/libllama.so not found (build llama.cpp first)"; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

log "building llref against $LLAMA"
g++ -O2 -std=c++17 -I "$LLAMA/include" -I "$LLAMA/ggml/include" "$LLREF_SRC" -L "$LLAMA/build/bin" \
  -lllama -lggml -lggml-base -Wl,-rpath,"$LLAMA/build/bin" -o "$WORK/llref"

log "building forge-cache"
(cd "$ROOT" && cargo build --release --quiet)
FORGE="$ROOT/target/release/forge-cache"

mkdir -p "$(dirname "$OUT")"
TMP_OUT="$WORK/out.jsonl"
: > "$TMP_OUT"
for entry in "${MODELS[@]}"; do
  read -r arch quant seed <<< "$entry"
  model="$WORK/$arch-$quant-$seed.gguf"
  "$FORGE" synth-model --arch "$arch" --quant "$quant" --seed "$seed" -o "$model" 2> "$WORK/synth.log" \
    || { cat "$WORK/synth.log" >&2; exit 1; }
  sha="$(sha256sum "$model" | cut -d' ' -f1)"
  prompts_for "$arch" > "$WORK/prompts.txt"
  log "$arch $quant seed $seed ($(stat -c %s "$model") bytes, sha256 ${sha:0:16}...)"
  "$WORK/llref" "$model" "$MAX_TOKENS" < "$WORK/prompts.txt" > "$WORK/llref.jsonl" 2> "$WORK/llref.log" \
    || { tail -20 "$WORK/llref.log" >&2; exit 1; }
  "$PYTHON" - "$arch" "$quant" "$seed" "$sha" "$WORK/prompts.txt" "$WORK/llref.jsonl" >> "$TMP_OUT" <<'PY'
import json, sys
arch, quant, seed, sha, prompts, results = sys.argv[1:7]
raw = [json.loads(l) for l in open(prompts) if l.strip()]
res = [json.loads(l) for l in open(results) if l.strip()]
if len(raw) != len(res):
    sys.exit(f"llref answered {len(res)} of {len(raw)} prompts")
for i, (p, r) in enumerate(zip(raw, res)):
    if "error" in r:
        sys.exit(f"llref failed on prompt {i}: {r}")
    rec = {"id": f"{arch}-{quant}-p{i}", "arch": arch, "quant": quant, "seed": int(seed), "sha256": sha, "raw_prompt": p}
    rec.update(r)
    print(json.dumps(rec, ensure_ascii=False))
PY
done
mv "$TMP_OUT" "$OUT"
log "wrote $(wc -l < "$OUT") records to $OUT"
