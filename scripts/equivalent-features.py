#!/usr/bin/env python3
"""Offline analysis of EQUIVALENT's label-free signals on QQP (docs/perf.md, issue 22).

Reads a store whose tenant ran a QQP workload with `serve --equivalent-explore 1.0` (every
candidate decoded, so `equivalence_outcomes` holds one row per scored request) and the workload
file (pair labels, used here only). For each feature, and for a logistic regression on all of
them (5-fold cross-validated, and in-sample as an optimistic bound), prints the best recall on
duplicate pairs reachable at 0 / <=1% / <=2% / <=4% false hits on non-duplicate pairs when the
threshold is chosen WITH the labels: an upper bound for any label-free rule on these features.

Usage: equivalent-features.py STORE.db WORKLOAD.jsonl"""
import json, math, random, sqlite3, struct, sys

db, wl = sys.argv[1], sys.argv[2]
first, second, seen = {}, {}, set()
for line in open(wl):
    l = json.loads(line)
    if l['pair'] in seen:
        second[l['prompt']] = (l['pair'], l['duplicate'])
    else:
        seen.add(l['pair'])
        first[l['prompt']] = l['pair']
dup = sum(1 for _, d in second.values() if d)
non = len(second) - dup
c = sqlite3.connect(f'file:{db}?mode=ro', uri=True)
rows = []
for q, s, sim, mean, worst, cll, fll, own_blob, toks in c.execute(
        """select q.question, s.question, o.similarity, o.mean_margin, o.worst_margin, o.candidate_ll,
                  o.fresh_ll, s.response_logprobs, s.response_tokens
           from equivalence_outcomes o join inferences q on q.id = o.inference_id
           join inferences s on s.id = o.source_inference_id"""):
    if q not in second:
        continue
    own = struct.unpack(f'<{len(own_blob) // 4}f', own_blob) if own_blob else [0.0]
    pair, d = second[q]
    own_mean = sum(own) / len(own)
    rows.append(dict(lab=bool(d and first.get(s) == pair), sim=sim, mean=mean, worst=worst, cll=cll, gap=cll - fll,
                     own=own_mean, logn=math.log(1 + len(json.loads(toks))), rel=mean / max(1e-3, -own_mean)))
print(f"second questions observed {len(rows)} of {len(second)} ({dup} duplicate pairs, {non} non-duplicate)")
budgets = [0, math.floor(0.01 * non), math.floor(0.02 * non), math.floor(0.04 * non)]

def recall(scores):
    best, hit, fh = [0] * len(budgets), 0, 0
    for sc, r in sorted(zip(scores, rows), key=lambda t: -t[0]):
        hit, fh = hit + r['lab'], fh + (not r['lab'])
        best = [max(b, hit) if fh <= k else b for b, k in zip(best, budgets)]
    return ' / '.join(f"{b} ({100 * b / dup:.1f}%)" for b in best)

print(f"best recall at false hits <= {budgets} of {non}, threshold chosen with the labels:")
names = ['sim', 'mean', 'worst', 'cll', 'gap', 'own', 'logn', 'rel']
for n in names:
    print(f"  {n:6} {recall([r[n] for r in rows])}")

def standardize(names):
    cols = [[r[n] for r in rows] for n in names]
    mu = [sum(col) / len(col) for col in cols]
    sd = [max(1e-9, (sum((v - m) ** 2 for v in col) / len(col)) ** 0.5) for col, m in zip(cols, mu)]
    return [[(r[n] - m) / s for n, m, s in zip(names, mu, sd)] for r in rows]

def fit(X, y, it=600, lr=0.5, l2=1e-2):
    w = [0.0] * (len(X[0]) + 1)
    for _ in range(it):
        g = [0.0] * len(w)
        for x, t in zip(X, y):
            p = 1 / (1 + math.exp(-max(-30, min(30, w[-1] + sum(a * b for a, b in zip(w, x))))))
            for i, v in enumerate(x):
                g[i] += (p - t) * v
            g[-1] += p - t
        w = [wi - lr * (gi / len(X) + (l2 * wi if i < len(w) - 1 else 0)) for i, (wi, gi) in enumerate(zip(w, g))]
    return w

y = [1 if r['lab'] else 0 for r in rows]
random.seed(1)
order = list(range(len(rows)))
random.shuffle(order)
for group in (['sim', 'mean'], ['sim', 'mean', 'worst'], names):
    X = standardize(group)
    cv = [0.0] * len(rows)
    for k in range(5):
        test = set(order[k::5])
        w = fit([X[i] for i in range(len(rows)) if i not in test], [y[i] for i in range(len(rows)) if i not in test])
        for i in test:
            cv[i] = w[-1] + sum(a * b for a, b in zip(w, X[i]))
    w = fit(X, y)
    ins = [w[-1] + sum(a * b for a, b in zip(w, x)) for x in X]
    print(f"  logistic {'+'.join(group)}: 5-fold CV {recall(cv)}; in-sample {recall(ins)}")

# A 2-D region: similarity >= s AND mean margin >= m (the corner a run-time learner could grow
# in both scores at once, e.g. a Wilson bound per (similarity band, margin) cell), thresholds
# chosen with the labels over every pair of observed values: an upper bound for such regions.
def box(a, b):
    best = [0] * len(budgets)
    for s in sorted({r[a] for r in rows}):
        inside = sorted((r for r in rows if r[a] >= s), key=lambda r: -r[b])
        hit = fh = 0
        for r in inside:
            hit, fh = hit + r['lab'], fh + (not r['lab'])
            best = [max(x, hit) if fh <= k else x for x, k in zip(best, budgets)]
    return ' / '.join(f"{x} ({100 * x / dup:.1f}%)" for x in best)

print(f"  box sim x mean (label-chosen corner) {box('sim', 'mean')}")
print(f"  box sim x worst (label-chosen corner) {box('sim', 'worst')}")
