#!/usr/bin/env bash
# The semantic-cache measurements of docs/perf.md, end to end against a real service:
#   1. Zipf-repeated questions (1000 requests): cache off vs VERIFIED (requests/s ratio)
#   2. QQP pairs: cache off vs VERIFIED (identical texts, requests/s)
#   3. TRUST: calibrate on QQP pairs (VERIFIED, one tenant), then TRUST on disjoint pairs
#   4. served semantic hits (TRUST) over gRPC: their latency (see "hit" below)
# Usage: scripts/ab-bench.sh [OUT_DIR]   (FORGE_BIN, DATA, QQP_PAIRS, CAL_PAIRS, HIT_QUESTIONS, ZIPF_REQUESTS override)
# PARTS="zipf qqp trust hit" picks parts (default: all); QQP_SERVE_FLAGS / HIT_SERVE_FLAGS add serve flags to the qqp / hit parts (e.g. --no-kv-reuse). The A/B parts run their two arms
# interleaved (`ab --interleave`: same load for both); SEQUENTIAL=1 runs them one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-ab-results}
BIN=${FORGE_BIN:-target/release/forge-cache}
DATA=${DATA:-../shared/data}
QQP=${QQP_PAIRS:-100}     # pairs in the QQP A/B run
CAL=${CAL_PAIRS:-300}     # pairs used to calibrate TRUST
HITQ=${HIT_QUESTIONS:-200} # questions of the hit-latency part
ZIPF=${ZIPF_REQUESTS:-1000} # requests of the Zipf part
PARTS=${PARTS:-zipf qqp trust hit}
ORDER=--interleave
[ "${SEQUENTIAL:-0}" = 1 ] && ORDER=""
part() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p "$OUT"
[ -x "$BIN" ] || cargo build --release
PORT=50091
SERVER=""
start() { # $1 = db, rest = serve flags
  local db=$1; shift
  rm -f "$db" "$db-wal" "$db-shm"
  "$BIN" serve --db "$db" --addr 127.0.0.1:$PORT --no-http "$@" >"$OUT/serve.log" 2>&1 &
  SERVER=$!
  "$BIN" health --server http://127.0.0.1:$PORT --wait 60 >/dev/null
}
stop() { kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true; }
trap stop EXIT
ab() { "$BIN" ab --server http://127.0.0.1:$PORT "$@"; }

# The Zipf pool holds 25 distinct questions, each computed once by the cache-on arm: with N
# requests the ratio can reach at most N / 25 (500 requests: exactly 20x), hence 1000 by default.
"$BIN" ab --make-workload zipf --data "$DATA" --requests "$ZIPF" --max-tokens 48 -o "$OUT/zipf.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * QQP)) --max-tokens 32 -o "$OUT/qqp.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * CAL)) --offset $QQP --max-tokens 32 -o "$OUT/qqp-cal.jsonl"
"$BIN" ab --make-workload qqp --data "$DATA" --requests $((2 * QQP)) --offset $((QQP + CAL)) --max-tokens 32 -o "$OUT/qqp-trust.jsonl"

if part zipf; then
start "$OUT/zipf.db"
echo "== zipf: cache off vs verified"; ab --workload "$OUT/zipf.jsonl" --mode verified $ORDER --json "$OUT/zipf.json" --out "$OUT/zipf"
stop
fi

if part qqp; then
start "$OUT/qqp.db" ${QQP_SERVE_FLAGS:-}
echo "== qqp: cache off vs verified"; ab --workload "$OUT/qqp.jsonl" --mode verified $ORDER --json "$OUT/qqp.json" --out "$OUT/qqp"
stop
fi

if part trust; then
start "$OUT/trust.db"
echo "== trust: calibration (verified, tenant qqp-trust, no off arm)"
ab --workload "$OUT/qqp-cal.jsonl" --mode verified --skip-off --on-tenant qqp-trust --json "$OUT/trust-cal.json" --out "$OUT/trust-cal"
echo "== trust: disjoint pairs, cache off vs trust"
ab --workload "$OUT/qqp-trust.jsonl" --mode trust --on-tenant qqp-trust $ORDER --json "$OUT/trust.json" --out "$OUT/trust"
"$BIN" stats --db "$OUT/trust.db" --tenant qqp-trust | tail -2
stop
fi

# Served semantic hits over gRPC. TRUST serves a neighbour's answer without the model only when
# verified outcomes bound the error at that similarity, and SmolLM2-135M rarely answers two
# phrasings alike, so this part uses the closest real rephrasing there is: each question, then
# the same question lower-cased (MiniLM is uncased: similarity 1.0; the LLM sees different
# text), with short answers (max_tokens $HIT_TOKENS), and a loose bound (--trust-delta 0.5: the
# served answers may differ from the model's; the off arm counts how many). Calibration: the
# first half of the questions, VERIFIED (tenant hit). Measured: the second half, TRUST against
# cache off, interleaved. What the TRUST row of "latency by tier" measures is the whole hit
# path: gRPC round trip, request validation and prompt rendering, the FACT and EXACT lookups,
# the question's embedding, the KNN, the trust decision, and recording the request.
HIT_TOKENS=${HIT_TOKENS:-4}
if part hit; then
python3 - "$DATA/qqp/qqp_pairs.jsonl" "$OUT/hit-cal.jsonl" "$OUT/hit.jsonl" "$HITQ" "$HIT_TOKENS" <<'PY'
import json, random, sys
src, cal, run, n, mt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
qs, seen = [], set()
for line in open(src):
    q = json.loads(line)["question1"].strip()
    if q and q != q.lower() and q.lower() not in seen and len(q) < 200:
        seen.add(q.lower())
        qs.append(q)
random.Random(7).shuffle(qs)
qs = qs[:n]
for path, part in ((cal, qs[: n // 2]), (run, qs[n // 2 :])):
    with open(path, "w") as out:
        for q in part:
            for p in (q, q.lower()):
                out.write(json.dumps({"prompt": p, "max_tokens": mt}) + "\n")
PY
start "$OUT/hit.db" --trust-delta 0.5 ${HIT_SERVE_FLAGS:-}
echo "== semantic hits: calibration (verified, tenant hit)"
ab --workload "$OUT/hit-cal.jsonl" --mode verified --skip-off --on-tenant hit --json "$OUT/hit-cal.json" --out "$OUT/hit-cal"
echo "== semantic hits: cache off vs trust (--trust-delta 0.5), interleaved"
ab --workload "$OUT/hit.jsonl" --mode trust --on-tenant hit --interleave --json "$OUT/hit.json" --out "$OUT/hit"
# There, every hit comes right after a model run (the as-written question is computed just
# before its lower-cased copy). The same workload once more, cache on only: the as-written
# questions are EXACT hits now, so the TRUST hits run one after another with no model run between.
echo "== semantic hits in sequence (the same workload again, trust, no off arm)"
ab --workload "$OUT/hit.jsonl" --mode trust --skip-off --on-tenant hit --json "$OUT/hit-seq.json" --out "$OUT/hit-seq"
"$BIN" stats --db "$OUT/hit.db" --tenant hit --trust-delta 0.5 | tail -2
stop
fi
