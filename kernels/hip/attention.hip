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

// attn_partial for a group of G consecutive tokens of a launch at once (prefill; G = 4:
// attn_partial_g4): one CTA per (chunk, head, group). Tokens of one cache (runs of equal k, v,
// cap; a group of several sequences is taken run by run) share each key and value load and its
// f16 conversion; every token's sums are attn_partial's, in its order (dot in dimension order,
// the same block_max / block_sum trees, each V slice in key order, slices in slice order), so
// the bits are the same. Loads go 4 at a time (32 dimensions of a key, 4 keys of a V slice).
// Grid (max_chunks, n_head, ceil(n_tok / G)), FC_ATT_THREADS threads.
template <int G>
FC_DEV void attn_partial_group(const float* qkv, int q_stride, int n_head, int n_kv, int hd, float scale,
                               const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks) {
    __shared__ __align__(16) float q[G][FC_ATT_MAX_HD];
    __shared__ float p[G][FC_ATT_CH];
    __shared__ float scratch[G][FC_ATT_THREADS / 32];
    __shared__ __align__(16) float opart[G][FC_ATT_THREADS * 8];
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int k0 = c * FC_ATT_CH;
    const int kvh = h / (n_head / n_kv);
    const int tend = min((int)blockIdx.z * G + G, n_tok);
    for (int r0 = blockIdx.z * G; r0 < tend;) {
        const TokInfo first = tok[r0];
        int r1 = r0 + 1;
        while (r1 < tend && tok[r1].k == first.k && tok[r1].v == first.v && tok[r1].cap == first.cap) ++r1;
        // keys of this chunk per token of the run (0: none, or not in the run)
        int nv[G];
        int nvmax = 0;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            nv[g] = r0 + g < r1 ? max(0, min(FC_ATT_CH, (int)tok[r0 + g].pos + 1 - k0)) : 0;
            nvmax = max(nvmax, nv[g]);
        }
        if (nvmax > 0) {  // uniform over the CTA
            const unsigned long long base = (((unsigned long long)layer * n_kv + kvh) * first.cap + k0) * hd;
            const uint16_t* kc = (const uint16_t*)first.k + base;
            const uint16_t* vc = (const uint16_t*)first.v + base;
            __syncthreads();  // the previous run is done with q, p, opart
            for (int i = tid; i < G * hd; i += FC_ATT_THREADS) {
                const int g = i / hd, d = i - g * hd;
                q[g][d] = r0 + g < r1 ? qkv[(unsigned long long)(r0 + g) * q_stride + h * hd + d] : 0.0f;
            }
            __syncthreads();
            float acc[G];
#pragma unroll
            for (int g = 0; g < G; ++g) acc[g] = 0.0f;
            if (tid < nvmax) {
                const uint16_t* k = kc + (unsigned long long)tid * hd;
                // 32 dimensions (4 loads in flight) at a time: hd is a multiple of 32
                for (int d0 = 0; d0 < hd; d0 += 32) {
                    uint4 u[4];
#pragma unroll
                    for (int x = 0; x < 4; ++x) u[x] = *(const uint4*)(k + d0 + 8 * x);
#pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        const int d = d0 + 8 * x;
                        const uint32_t w[4] = {u[x].x, u[x].y, u[x].z, u[x].w};
                        float kf[8];
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            kf[2 * j] = f16_to_f32((uint16_t)(w[j] & 0xFFFF));
                            kf[2 * j + 1] = f16_to_f32((uint16_t)(w[j] >> 16));
                        }
#pragma unroll
                        for (int g = 0; g < G; ++g) {
                            const float4 a = *(const float4*)&q[g][d];
                            const float4 b = *(const float4*)&q[g][d + 4];
                            float y = acc[g];
                            y = __fmaf_rn(a.x, kf[0], y);
                            y = __fmaf_rn(a.y, kf[1], y);
                            y = __fmaf_rn(a.z, kf[2], y);
                            y = __fmaf_rn(a.w, kf[3], y);
                            y = __fmaf_rn(b.x, kf[4], y);
                            y = __fmaf_rn(b.y, kf[5], y);
                            y = __fmaf_rn(b.z, kf[6], y);
                            y = __fmaf_rn(b.w, kf[7], y);
                            acc[g] = y;
                        }
                    }
                }
            }
            // block_max and block_sum of every token at once, each with their tree
            float m[G], l[G];
#pragma unroll
            for (int g = 0; g < G; ++g) m[g] = warp_max(tid < nv[g] ? __fmul_rn(acc[g], scale) : __int_as_float(0xff800000));
            __syncthreads();
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < G; ++g) scratch[g][warp] = m[g];
            }
            __syncthreads();
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float s = tid < nv[g] ? __fmul_rn(acc[g], scale) : __int_as_float(0xff800000);
                float mx = scratch[g][0];
                for (int w = 1; w < FC_ATT_THREADS / 32; ++w) mx = fmaxf(mx, scratch[g][w]);
                m[g] = mx;
                const float e = tid < nv[g] ? expf(__fsub_rn(s, mx)) : 0.0f;
                p[g][tid] = e;
                l[g] = warp_sum(e);
            }
            __syncthreads();
            if (lane == 0) {
#pragma unroll
                for (int g = 0; g < G; ++g) scratch[g][warp] = l[g];
            }
            __syncthreads();  // also publishes p
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float sum = scratch[g][0];
                for (int w = 1; w < FC_ATT_THREADS / 32; ++w) sum = __fadd_rn(sum, scratch[g][w]);
                l[g] = sum;
            }
            // o = sum_j p[j] * v[j] per token, slices as in attn_partial
            const int dv = hd / 8, ns = FC_ATT_THREADS / dv, per = FC_ATT_CH / ns;
            const int s0 = tid / dv, d0 = (tid % dv) * 8;
            const int j0 = s0 * per, j1 = min(j0 + per, nvmax);
            float o[G][8];
#pragma unroll
            for (int g = 0; g < G; ++g)
#pragma unroll
                for (int i = 0; i < 8; ++i) o[g][i] = 0.0f;
            // 4 keys (loads in flight) at a time: per is a multiple of 4; key j counts for token g
            // where j < nv[g] (<= nvmax)
            for (int j = j0; j < j1; j += 4) {
                uint4 u[4];
#pragma unroll
                for (int x = 0; x < 4; ++x)
                    u[x] = j + x < j1 ? *(const uint4*)(vc + (unsigned long long)(j + x) * hd + d0) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    const uint32_t w[4] = {u[x].x, u[x].y, u[x].z, u[x].w};
                    float vf[8];
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        vf[2 * i] = f16_to_f32((uint16_t)(w[i] & 0xFFFF));
                        vf[2 * i + 1] = f16_to_f32((uint16_t)(w[i] >> 16));
                    }
#pragma unroll
                    for (int g = 0; g < G; ++g) {
                        const float pj = p[g][j + x];
                        if (j + x < nv[g]) {
#pragma unroll
                            for (int i = 0; i < 8; ++i) o[g][i] = __fmaf_rn(pj, vf[i], o[g][i]);
                        }
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < G; ++g) {
                *(float4*)&opart[g][s0 * hd + d0] = make_float4(o[g][0], o[g][1], o[g][2], o[g][3]);
                *(float4*)&opart[g][s0 * hd + d0 + 4] = make_float4(o[g][4], o[g][5], o[g][6], o[g][7]);
            }
            __syncthreads();
            for (int i = tid; i < G * hd; i += FC_ATT_THREADS) {
                const int g = i / hd, d = i - g * hd, t = r0 + g;
                if (t < r1 && (int)tok[t].pos + 1 > k0) {
                    float a = opart[g][d];
                    for (int k = 1; k < ns; ++k) a = __fadd_rn(a, opart[g][k * hd + d]);
                    part[(((unsigned long long)t * n_head + h) * max_chunks + c) * (hd + 2) + d] = a;
                }
            }
            if (tid == 0) {
#pragma unroll
                for (int g = 0; g < G; ++g) {
                    if (nv[g] > 0) {
                        float* out = part + ((((unsigned long long)(r0 + g)) * n_head + h) * max_chunks + c) * (hd + 2);
                        out[hd] = m[g];
                        out[hd + 1] = l[g];
                    }
                }
            }
        }
        r0 = r1;
    }
}

extern "C" __global__ void attn_partial_g4(const float* qkv, int q_stride, int n_head, int n_kv, int hd, float scale,
                                           const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks) {
    attn_partial_group<4>(qkv, q_stride, n_head, n_kv, hd, scale, tok, n_tok, layer, part, max_chunks);
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
