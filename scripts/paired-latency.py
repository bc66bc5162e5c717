#!/usr/bin/env python3
"""Paired server-side latencies of an interleaved `forge-cache ab` run, from the service's log
(`request` lines): the i-th cache-off request against the i-th cache-on one (the same workload
line). Usage: paired-latency.py serve.log"""
import re, statistics as st, sys

off, on = {}, {}
for line in open(sys.argv[1]):
    if 'request_id=' not in line:
        continue
    d = dict(re.findall(r'(\w+)=([\w.\-]+)', line))
    (off if '-off-' in d.get('tenant', '') else on)[int(d['request_id'])] = d
pairs = list(zip([off[k] for k in sorted(off)], [on[k] for k in sorted(on)]))
f = lambda x, k: float(x[k])
def show(name, diffs):
    print(f"{name}: on - off mean {st.mean(diffs):+.2f} ms, median {st.median(diffs):+.2f} ms (n={len(diffs)})")
show('latency', [f(b, 'latency_ms') - f(a, 'latency_ms') for a, b in pairs])
show('time to first token', [f(b, 'ttft_ms') - f(a, 'ttft_ms') for a, b in pairs])
show('after the first token', [(f(b, 'latency_ms') - f(b, 'ttft_ms')) - (f(a, 'latency_ms') - f(a, 'ttft_ms')) for a, b in pairs])
model = [(a, b) for a, b in pairs if b['served_from'] == 'MODEL']
if model:
    show('latency, cache-on answers served from MODEL', [f(b, 'latency_ms') - f(a, 'latency_ms') for a, b in model])
skipped = [b for _, b in pairs if b.get('lookup_skipped') == 'true']
if skipped:
    print(f"cache-on requests that skipped the semantic tier: {len(skipped)}/{len(pairs)}")
    show('latency, those requests', [f(b, 'latency_ms') - f(a, 'latency_ms') for a, b in pairs if b.get('lookup_skipped') == 'true'])
