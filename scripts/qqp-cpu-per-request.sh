#!/bin/bash
# The service's CPU time (user + system, all its threads) per request, per arm: `ab` without
# --interleave (the whole BYPASS arm, then the cache-on arm) on one fresh service while the
# process's CPU ticks are sampled every 0.2 s; the boundary is the last BYPASS request's log line.
# CPU per request depends much less on other processes than wall time does (docs/perf.md, issue
# 22). Usage: scripts/qqp-cpu-per-request.sh OUT_DIR [extra serve flags...]
# (the workload is qqp-verified-ab.sh's 400 QQP requests, cache-on arm VERIFIED).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FORGE_BIN:-$root/target/release/forge-cache}
out=$1; shift
mkdir -p "$out"; cd "$out"
[ -f verified.jsonl ] || "$bin" ab --make-workload qqp -o verified.jsonl --requests "${REQUESTS:-400}" --offset 1200 --max-tokens 32
rm -f cpu.db cpu.db-*
port=$((50300 + RANDOM % 400))
"$bin" serve --db cpu.db --threads 2 --no-http --addr 127.0.0.1:$port --no-kv-reuse "$@" > cpu-serve.log 2>&1 &
serve=$!
trap 'kill $serve 2>/dev/null || true; kill $poll 2>/dev/null || true' EXIT
"$bin" health --server http://127.0.0.1:$port --wait 120 > /dev/null
(while sleep 0.2; do echo "$(date +%s.%N) $(awk '{print $14 + $15}' /proc/$serve/stat) $(cut -d' ' -f1 /proc/loadavg)"; done) > ticks & poll=$!
sleep 0.5
"$bin" ab --server http://127.0.0.1:$port --workload verified.jsonl --mode verified > cpu-ab.out 2>&1
sleep 0.5
kill $poll
python3 - "$(getconf CLK_TCK)" <<'PY'
import datetime, re, sys
hz = int(sys.argv[1])
ticks = [tuple(map(float, l.split())) for l in open('ticks') if len(l.split()) == 3]
def at(t):  # ticks at epoch time t (the first sample at or after it)
    return next((k for s, k, _ in ticks if s >= t), ticks[-1][1])
ts = lambda l: datetime.datetime.fromisoformat(l.split()[0].rstrip('Z')).replace(tzinfo=datetime.timezone.utc).timestamp()
reqs = [l for l in open('cpu-serve.log') if 'request_id=' in l]
off = [l for l in reqs if '-off-' in l]
on = [l for l in reqs if '-off-' not in l]
t0, tb, t1 = ticks[0][1], at(ts(off[-1])), ticks[-1][1]
loads = [x for _, _, x in ticks]
skipped = sum('lookup_skipped=true' in l for l in on)
print(f"CPU ms per request: BYPASS {(tb - t0) * 1000 / hz / len(off):.1f} (n={len(off)}), cache on {(t1 - tb) * 1000 / hz / len(on):.1f} (n={len(on)}, semantic tier skipped {skipped}); "
      f"ratio on/off {(t1 - tb) / len(on) / ((tb - t0) / len(off)):.3f}; load {min(loads)}-{max(loads)}")
PY
grep -E "^\| cache" cpu-ab.out || true
