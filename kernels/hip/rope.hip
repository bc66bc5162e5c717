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

// The rotation of rope_pair on a pair held in registers.
FC_DEV float2 rope_pair2(float2 p, float2 cs) {
    return make_float2(__fsub_rn(__fmul_rn(p.x, cs.x), __fmul_rn(p.y, cs.y)), __fadd_rn(__fmul_rn(p.x, cs.y), __fmul_rn(p.y, cs.x)));
}

// Two f16 values as one little-endian word (lo at the lower address).
FC_DEV uint32_t f16x2(float lo, float hi) { return (uint32_t)f32_to_f16(lo) | ((uint32_t)f32_to_f16(hi) << 16); }

// qkv: [n_tok, n_head*hd + 2*kvd] rows (q | k | v), kvd = n_kv*hd. Rotates q in place, and writes
// rotated k and v as f16 at the token's position of layer `layer` of its sequence's cache.
// Grid (n_tok, ceil(work / blockDim.x)): one thread per q pair, k pair or v pair (pairs are
// 8-byte aligned in qkv, 4-byte aligned in the caches: hd is even).
extern "C" __global__ void rope_store(float* qkv, int n_head, int n_kv, int hd, const float* table, const TokInfo* tok, int layer) {
    const int t = blockIdx.x, half = hd / 2, qd = n_head * hd, kvd = n_kv * hd;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    const TokInfo ti = tok[t];
    float2* row = (float2*)(qkv + (unsigned long long)t * (qd + 2 * kvd));
    const float2* cs = (const float2*)(table + (unsigned long long)ti.pos * hd);
    if (j < qd / 2) {
        row[j] = rope_pair2(row[j], cs[j % half]);
    } else if (j < qd / 2 + kvd / 2) {
        const int i = j - qd / 2;
        const float2 p = rope_pair2(row[qd / 2 + i], cs[i % half]);
        const int h = (2 * i) / hd, d = (2 * i) % hd;
        uint32_t* kc = (uint32_t*)ti.k;
        kc[((((unsigned long long)layer * n_kv + h) * ti.cap + ti.pos) * hd + d) / 2] = f16x2(p.x, p.y);
    } else if (j < qd / 2 + kvd) {
        const int i = j - qd / 2 - kvd / 2, h = (2 * i) / hd, d = (2 * i) % hd;
        const float2 p = row[(qd + kvd) / 2 + i];
        uint32_t* vc = (uint32_t*)ti.v;
        vc[((((unsigned long long)layer * n_kv + h) * ti.cap + ti.pos) * hd + d) / 2] = f16x2(p.x, p.y);
    }
}
