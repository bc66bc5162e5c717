// Rotary embedding on adjacent pairs (GGML's "normal" mode) with the CPU's (cos, sin) table,
// and the store of keys and values into a sequence's f16 cache. Products are rounded one by one
// (__fmul_rn) as the CPU computes them, so a rotated value has the CPU's bits.
#pragma once
#include "common.h"

FC_DEV void rope_pair(float* p, const float* cs) {
    const float x0 = p[0], x1 = p[1], c = cs[0], s = cs[1];
    p[0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    p[1] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
}

// x: [n_tok, n_head * hd]; pos: [n_tok]; table: [n_pos, hd / 2, 2]. One CTA per token.
extern "C" __global__ void rope(float* x, int n_head, int hd, const float* table, const uint32_t* pos) {
    const int t = blockIdx.x, half = hd / 2;
    float* row = x + (unsigned long long)t * n_head * hd;
    const float* cs = table + (unsigned long long)pos[t] * hd;
    for (int i = threadIdx.x; i < n_head * half; i += blockDim.x) rope_pair(row + 2 * i, cs + 2 * (i % half));
}

// qkv: [n_tok, n_head*hd + 2*kvd] rows (q | k | v), kvd = n_kv*hd. Rotates q in place, and writes
// rotated k and v as f16 at the token's position of layer `layer` of its sequence's cache.
// Grid (n_tok, ceil(work / blockDim.x)): one thread per q pair, k pair or v value.
extern "C" __global__ void rope_store(float* qkv, int n_head, int n_kv, int hd, const float* table, const TokInfo* tok, int layer) {
    const int t = blockIdx.x, half = hd / 2, qd = n_head * hd, kvd = n_kv * hd;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    const TokInfo ti = tok[t];
    float* row = qkv + (unsigned long long)t * (qd + 2 * kvd);
    const float* cs = table + (unsigned long long)ti.pos * hd;
    if (j < qd / 2) {
        rope_pair(row + 2 * j, cs + 2 * (j % half));
    } else if (j < qd / 2 + kvd / 2) {
        const int i = j - qd / 2;
        float p[2] = {row[qd + 2 * i], row[qd + 2 * i + 1]};
        rope_pair(p, cs + 2 * (i % half));
        const int h = (2 * i) / hd, d = (2 * i) % hd;
        uint16_t* kc = (uint16_t*)ti.k;
        const unsigned long long at = (((unsigned long long)layer * n_kv + h) * ti.cap + ti.pos) * hd + d;
        kc[at] = f32_to_f16(p[0]);
        kc[at + 1] = f32_to_f16(p[1]);
    } else if (j < qd / 2 + kvd / 2 + kvd) {
        const int i = j - qd / 2 - kvd / 2, h = i / hd, d = i % hd;
        uint16_t* vc = (uint16_t*)ti.v;
        vc[(((unsigned long long)layer * n_kv + h) * ti.cap + ti.pos) * hd + d] = f32_to_f16(row[qd + kvd + i]);
    }
}
