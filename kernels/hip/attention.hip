// Causal attention over a sequence's f16 cache, for prefill and decode alike.
//
// Keys are cut into chunks of FC_ATT_CH = 128 positions at absolute positions 0, 128, 256, ...
// (the CPU's ATT_TILE). attn_partial computes, for one (token, head, chunk), the chunk's max score
// m, the sum l of exp(score - m) and o = sum exp(score - m) * v, every sum in a fixed order;
// attn_merge combines a token's chunks in chunk order (two passes: the max, then the sums) and
// divides. A token's chunks are fixed by its position alone, so its result is the same in a
// prefill batch and in decode (batch invariance); decode spreads one token's keys over many CTAs.
#pragma once
#include "common.h"

#define FC_ATT_CH 128
#define FC_ATT_THREADS 128
#define FC_ATT_MAX_HD 256

// q rows: qkv [n_tok, q_stride] with head h at h*hd; part: [n_tok, n_head, max_chunks, hd + 2].
// Grid (max_chunks, n_head, n_tok), FC_ATT_THREADS threads; hd in {32, 64, 128, 256}.
extern "C" __global__ void attn_partial(const float* qkv, int q_stride, int n_head, int n_kv, int hd, float scale,
                                        const TokInfo* tok, int layer, float* part, int max_chunks) {
    __shared__ float q[FC_ATT_MAX_HD];
    __shared__ float p[FC_ATT_CH];
    __shared__ float scratch[FC_ATT_THREADS / 32];
    __shared__ float opart[FC_ATT_THREADS * 8];
    const int c = blockIdx.x, h = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const TokInfo ti = tok[t];
    const int k0 = c * FC_ATT_CH;
    const int n_keys = (int)ti.pos + 1;
    if (k0 >= n_keys) return;  // uniform over the CTA
    const int nv = min(FC_ATT_CH, n_keys - k0);
    const int kvh = h / (n_head / n_kv);
    const unsigned long long base = (((unsigned long long)layer * n_kv + kvh) * ti.cap + k0) * hd;
    const uint16_t* kc = (const uint16_t*)ti.k + base;
    const uint16_t* vc = (const uint16_t*)ti.v + base;
    for (int d = tid; d < hd; d += FC_ATT_THREADS) q[d] = qkv[(unsigned long long)t * q_stride + h * hd + d];
    __syncthreads();
    // scores: one key per thread, dot in dimension order
    float s = __int_as_float(0xff800000);  // -inf
    if (tid < nv) {
        const uint16_t* k = kc + (unsigned long long)tid * hd;
        float acc = 0.0f;
        for (int d = 0; d < hd; d += 8) {
            const uint4 u = *(const uint4*)(k + d);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                acc = __fmaf_rn(q[d + 2 * j], f16_to_f32((uint16_t)(w[j] & 0xFFFF)), acc);
                acc = __fmaf_rn(q[d + 2 * j + 1], f16_to_f32((uint16_t)(w[j] >> 16)), acc);
            }
        }
        s = __fmul_rn(acc, scale);
    }
    const float m = block_max(s, scratch, FC_ATT_THREADS / 32);
    const float e = tid < nv ? expf(__fsub_rn(s, m)) : 0.0f;
    p[tid] = e;
    const float l = block_sum(e, scratch, FC_ATT_THREADS / 32);  // its first barrier publishes p
    // o = sum_j p[j] * v[j]: each thread 8 dimensions (one 16-byte load per key) of a slice of
    // the keys, in key order; the slices' sums are then added in slice order
    float* out = part + (((unsigned long long)t * n_head + h) * max_chunks + c) * (hd + 2);
    {
        const int dv = hd / 8, ns = FC_ATT_THREADS / dv, per = FC_ATT_CH / ns;
        const int s0 = tid / dv, d0 = (tid % dv) * 8;
        const int j0 = s0 * per, j1 = min(j0 + per, nv);
        float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int j = j0; j < j1; ++j) {
            const uint4 u = *(const uint4*)(vc + (unsigned long long)j * hd + d0);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
            const float pj = p[j];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                o[2 * i] = __fmaf_rn(pj, f16_to_f32((uint16_t)(w[i] & 0xFFFF)), o[2 * i]);
                o[2 * i + 1] = __fmaf_rn(pj, f16_to_f32((uint16_t)(w[i] >> 16)), o[2 * i + 1]);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) opart[s0 * hd + d0 + i] = o[i];
        __syncthreads();
        for (int d = tid; d < hd; d += FC_ATT_THREADS) {
            float acc = opart[d];
            for (int k = 1; k < ns; ++k) acc = __fadd_rn(acc, opart[k * hd + d]);
            out[d] = acc;
        }
    }
    if (tid == 0) {
        out[hd] = m;
        out[hd + 1] = l;
    }
}

// att[t] = the heads' outputs from their chunks (see the file comment); with q8 also attq
// (hd % 32 == 0: a head is whole q8 blocks). Grid (n_tok, n_head), FC_ATT_THREADS threads,
// max_chunks * 8 bytes of dynamic shared memory. The chunk weights f_c = exp(m_c - max m) and the
// sum of l_c * f_c are computed once per CTA (every thread the same way), then each dimension's
// sum of o_c * f_c in chunk order.
extern "C" __global__ void attn_merge(const float* part, int n_head, int hd, int max_chunks, const TokInfo* tok,
                                      float* att, BlockQ8* attq, int q8) {
    extern __shared__ float mf[];  // [max_chunks] chunk max, then [max_chunks] l_c * f_c; f_c over the max
    float* lf = mf + max_chunks;
    __shared__ float fsh[1];
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, qd = n_head * hd;
    const int nc = ((int)tok[t].pos + FC_ATT_CH) / FC_ATT_CH;
    const float* ph = part + ((unsigned long long)t * n_head + h) * max_chunks * (hd + 2);
    float* row = att + (unsigned long long)t * qd + h * hd;
    for (int c = tid; c < nc; c += FC_ATT_THREADS) mf[c] = ph[c * (hd + 2) + hd];
    __syncthreads();
    float mx = mf[0];
    for (int c = 1; c < nc; ++c) mx = fmaxf(mx, mf[c]);
    __syncthreads();
    for (int c = tid; c < nc; c += FC_ATT_THREADS) {
        const float f = expf(__fsub_rn(mf[c], mx));
        mf[c] = f;
        lf[c] = __fmul_rn(ph[c * (hd + 2) + hd + 1], f);
    }
    __syncthreads();
    if (tid == 0) {
        float l = lf[0];
        for (int c = 1; c < nc; ++c) l = __fadd_rn(l, lf[c]);
        fsh[0] = 1.0f / l;
    }
    __syncthreads();
    const float inv = fsh[0];
    for (int d = tid; d < hd; d += FC_ATT_THREADS) {
        float o = 0.0f;
#pragma unroll 8
        for (int c = 0; c < nc; ++c) o = __fmaf_rn(ph[c * (hd + 2) + d], mf[c], o);
        row[d] = __fmul_rn(o, inv);
    }
    if (q8) {
        __syncthreads();
        const int lane = tid & 31;
        for (int b = tid >> 5; b < hd / 32; b += FC_ATT_THREADS / 32)
            quantize_warp_q8(row[32 * b + lane], attq + (unsigned long long)t * (qd / 32) + (h * hd) / 32 + b);
    }
}
