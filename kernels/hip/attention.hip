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

// attn_partial for every query head of one KV head (qpk = n_head / n_kv of them, at most 32) and
// G = 32 / qpk consecutive tokens at once (prefill): one CTA per (chunk, KV head, group), its 32
// rows (token g, head hq) at row g * qpk + hq. The chunk's keys and values are copied once into
// shared memory (f16, as stored) and serve all rows; warp w takes rows 8w .. 8w + 7, lane l the
// keys l + 32 i (attn_partial's thread of warp i) and dimensions l * HD / 32 .. of the values.
// Tokens of one cache are taken run by run (as attn_partial_group does). Every row's float steps
// are attn_partial's, in its order: each score a dot in dimension order, then * scale; the max
// (exact in any order: no score is -0, and a max of +-0 would change no output); e = exp(s - max);
// l as block_sum's tree (each 32 keys' butterfly, computed from shared memory as the same pairs,
// then the 4 in warp order); o per slice of HD / 8 keys in key order (key j counts where j < nv),
// the slices added in slice order. So a token's bits are the one-token kernel's.
// Grid (max_chunks, n_kv, ceil(n_tok / G)), FC_ATT_THREADS threads; HD 32 or 64.
#define FC_ATT_KR 32  // rows per CTA
#define FC_ATT_PS 36  // floats per key of P (32 rows + 4: conflict-free float4 stores)
// Pieces of the KV-head kernels (attn_partial_kv_body and attn_fused_kv_body), one chunk of
// FC_ATT_CH keys at a time. Row 8 warp + r of a CTA (r < 8) is token tz + row / qpk, query head
// kvh * qpk + row % qpk; only the tokens r0 .. r1 of the run being walked (one cache) take part.
// Each piece is attn_partial's float steps for those rows, in its order.

// The chunk's keys (from k0) for the warp's 8 rows, into nv (0: none, or not in the run); returns
// the fewest of those with any (the value slices below it need no per-row test).
FC_DEV int kv_row_keys(const TokInfo* tok, int tz, int qpk, int G, int r0, int r1, int k0, int warp, int nv[8]) {
    int nvmin = FC_ATT_CH;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int row = 8 * warp + r, t = tz + row / qpk;
        nv[r] = row < G * qpk && t >= r0 && t < r1 ? max(0, min(FC_ATT_CH, (int)tok[t].pos + 1 - k0)) : 0;
        if (nv[r] > 0) nvmin = min(nvmin, nv[r]);
    }
    return nvmin;
}

// Scores of the warp's 8 rows x keys lane + 32 i (i < 4), K in shared memory as f16 pairs, KW
// words per key: each a dot in dimension order, then * scale (-inf past a row's keys); mx[r] the
// row's max over the chunk.
template <int HD, int KW>
FC_DEV void kv_scores(const uint32_t* kp, const float* qs, const int nv[8], float scale, int lane, int warp, float acc[8][4], float mx[8]) {
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
#pragma unroll 2
    for (int d = 0; d < HD; d += 4) {
        float kf[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            uint32_t w0, w1;
            if (KW % 2 == 0) {  // 8-byte aligned: one 64-bit read
                const uint2 w = *(const uint2*)&kp[(lane + 32 * i) * KW + d / 2];
                w0 = w.x;
                w1 = w.y;
            } else {
                w0 = kp[(lane + 32 * i) * KW + d / 2];
                w1 = kp[(lane + 32 * i) * KW + d / 2 + 1];
            }
            kf[i][0] = f16_to_f32((uint16_t)(w0 & 0xFFFF));
            kf[i][1] = f16_to_f32((uint16_t)(w0 >> 16));
            kf[i][2] = f16_to_f32((uint16_t)(w1 & 0xFFFF));
            kf[i][3] = f16_to_f32((uint16_t)(w1 >> 16));
        }
#pragma unroll
        for (int r = 0; r < 8; ++r) {
            const float4 a = *(const float4*)&qs[(8 * warp + r) * HD + d];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float y = acc[r][i];
                y = __fmaf_rn(a.x, kf[i][0], y);
                y = __fmaf_rn(a.y, kf[i][1], y);
                y = __fmaf_rn(a.z, kf[i][2], y);
                y = __fmaf_rn(a.w, kf[i][3], y);
                acc[r][i] = y;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        float m = __int_as_float(0xff800000);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float s = lane + 32 * i < nv[r] ? __fmul_rn(acc[r][i], scale) : __int_as_float(0xff800000);
            acc[r][i] = s;
            m = fmaxf(m, s);
        }
        mx[r] = warp_max(m);
    }
}

// P[key][8 warp + r] = exp(score - mx[r]) (0 past the row's keys).
FC_DEV void kv_write_p(const float acc[8][4], const int nv[8], const float mx[8], float* P, int lane, int warp) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int j = lane + 32 * i;
        float e[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) e[r] = j < nv[r] ? expf(__fsub_rn(acc[r][i], mx[r])) : 0.0f;
        *(float4*)&P[j * FC_ATT_PS + 8 * warp] = make_float4(e[0], e[1], e[2], e[3]);
        *(float4*)&P[j * FC_ATT_PS + 8 * warp + 4] = make_float4(e[4], e[5], e[6], e[7]);
    }
}

// (P published) l of row `lane` over keys 32 warp .. 32 warp + 31, warp_sum's butterfly as its
// pairs, into lsh[warp][lane].
FC_DEV void kv_l_part(const float* P, float (*lsh)[FC_ATT_KR], int lane, int warp) {
    const float* pw = P + (32 * warp) * FC_ATT_PS + lane;
    float a[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) a[k] = __fadd_rn(pw[k * FC_ATT_PS], pw[(k + 16) * FC_ATT_PS]);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = __fadd_rn(a[k], a[k + 8]);
#pragma unroll
    for (int k = 0; k < 4; ++k) a[k] = __fadd_rn(a[k], a[k + 4]);
#pragma unroll
    for (int k = 0; k < 2; ++k) a[k] = __fadd_rn(a[k], a[k + 2]);
    lsh[warp][lane] = __fadd_rn(a[0], a[1]);
}

// o: the warp's 8 rows x HD / 32 dimensions (lane's), sum of P * V per slice of HD / 8 keys in key
// order (key j counts where j < nv[r]), the slices added in slice order.
template <int HD>
FC_DEV void kv_pv(const float* P, const uint16_t* vs, const int nv[8], int nvmin, int nvmax, int lane, int warp, float o[8][HD / 32]) {
    constexpr int DL = HD / 32;
    constexpr int PER = HD / 8;
    float sl[8][DL];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int x = 0; x < DL; ++x) o[r][x] = 0.0f;
    for (int s = 0; s < FC_ATT_CH / PER; ++s) {
        const int j0 = s * PER;
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int x = 0; x < DL; ++x) sl[r][x] = 0.0f;
        if (j0 < nvmax) {
            const bool all = j0 + PER <= nvmin;  // uniform over the warp
#pragma unroll 4
            for (int j = j0; j < min(j0 + PER, nvmax); ++j) {
                const float4 pa = *(const float4*)&P[j * FC_ATT_PS + 8 * warp];
                const float4 pb = *(const float4*)&P[j * FC_ATT_PS + 8 * warp + 4];
                const float p[8] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
                float v[DL];
                if (DL == 2) {
                    const uint32_t w = *(const uint32_t*)&vs[j * HD + 2 * lane];
                    v[0] = f16_to_f32((uint16_t)(w & 0xFFFF));
                    v[DL - 1] = f16_to_f32((uint16_t)(w >> 16));
                } else {
                    v[0] = f16_to_f32(vs[j * HD + lane]);
                }
#pragma unroll
                for (int r = 0; r < 8; ++r) {
                    if (all || j < nv[r]) {
#pragma unroll
                        for (int x = 0; x < DL; ++x) sl[r][x] = __fmaf_rn(p[r], v[x], sl[r][x]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int x = 0; x < DL; ++x) o[r][x] = s == 0 ? sl[r][x] : __fadd_rn(o[r][x], sl[r][x]);
    }
}

// The warp's rows' o and max of chunk c into part ([n_tok, n_head, max_chunks, HD + 2]).
template <int HD>
FC_DEV void kv_store_om(float* part, const float o[8][HD / 32], const float mx[8], const int nv[8], int tz, int qpk, int kvh, int n_head, int max_chunks, int c, int lane, int warp) {
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        if (nv[r] > 0) {
            const int row = 8 * warp + r, t = tz + row / qpk, h = kvh * qpk + row % qpk;
            float* out = part + (((unsigned long long)t * n_head + h) * max_chunks + c) * (HD + 2);
#pragma unroll
            for (int x = 0; x < HD / 32; ++x) out[lane * (HD / 32) + x] = o[r][x];
            if (lane == 0) out[HD] = mx[r];
        }
    }
}

// (lsh published) each row's l of chunk c (at k0), its warps' parts added in warp order, into part.
template <int HD>
FC_DEV void kv_store_l(float* part, float (*lsh)[FC_ATT_KR], const TokInfo* tok, int tz, int qpk, int G, int r0, int r1, int k0, int kvh, int n_head, int max_chunks, int c, int tid) {
    if (tid < FC_ATT_KR) {
        const int row = tid, t = tz + row / qpk;
        if (row < G * qpk && t >= r0 && t < r1 && (int)tok[t].pos + 1 > k0) {
            float l = lsh[0][row];
#pragma unroll
            for (int w = 1; w < FC_ATT_THREADS / 32; ++w) l = __fadd_rn(l, lsh[w][row]);
            part[(((unsigned long long)t * n_head + kvh * qpk + row % qpk) * max_chunks + c) * (HD + 2) + HD + 1] = l;
        }
    }
}

template <int HD>
FC_DEV void attn_partial_kv_body(const float* qkv, int q_stride, int n_head, int n_kv, float scale,
                                 const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks) {
    constexpr int KW = HD / 2 + 1;  // words per key of K (odd: a warp's 32 keys in 32 banks)
    constexpr int KP = KW > FC_ATT_PS ? FC_ATT_CH * KW : FC_ATT_CH * FC_ATT_PS;
    constexpr int DL = HD / 32;     // dimensions per lane of the value sums
    __shared__ __align__(16) uint32_t kp[KP];  // K as f16 pairs [key][KW]; then P [key][FC_ATT_PS]
    __shared__ __align__(16) uint16_t vs[FC_ATT_CH * HD];
    __shared__ __align__(16) float qs[FC_ATT_KR * HD];
    __shared__ float lsh[FC_ATT_THREADS / 32][FC_ATT_KR];
    const int c = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qpk = n_head / n_kv, G = FC_ATT_KR / qpk, tz = blockIdx.z * G;
    const int k0 = c * FC_ATT_CH;
    const int tend = min(tz + G, n_tok);
    float* P = (float*)kp;
    for (int r0 = tz; r0 < tend;) {
        const TokInfo first = tok[r0];
        int r1 = r0 + 1;
        while (r1 < tend && tok[r1].k == first.k && tok[r1].v == first.v && tok[r1].cap == first.cap) ++r1;
        int nvmax = 0;
        for (int t = r0; t < r1; ++t) nvmax = max(nvmax, min(FC_ATT_CH, (int)tok[t].pos + 1 - k0));
        if (nvmax > 0) {  // uniform over the CTA
            int nv[8];
            const int nvmin = kv_row_keys(tok, tz, qpk, G, r0, r1, k0, warp, nv);
            const unsigned long long base = (((unsigned long long)layer * n_kv + kvh) * first.cap + k0) * HD;
            const uint16_t* kc = (const uint16_t*)first.k + base;
            const uint16_t* vc = (const uint16_t*)first.v + base;
            __syncthreads();  // the previous run is done with the shared arrays
            for (int i = tid; i < nvmax * (HD / 8); i += FC_ATT_THREADS) {
                const int j = i / (HD / 8), d8 = (i % (HD / 8)) * 8;
                const uint4 a = *(const uint4*)(kc + (unsigned long long)j * HD + d8);
                uint32_t* dst = kp + j * KW + d8 / 2;
                dst[0] = a.x;
                dst[1] = a.y;
                dst[2] = a.z;
                dst[3] = a.w;
                *(uint4*)(vs + j * HD + d8) = *(const uint4*)(vc + (unsigned long long)j * HD + d8);
            }
            for (int i = tid; i < FC_ATT_KR * HD; i += FC_ATT_THREADS) {
                const int row = i / HD, d = i - row * HD, t = tz + row / qpk;
                qs[i] = row < G * qpk && t >= r0 && t < r1 ? qkv[(unsigned long long)t * q_stride + (kvh * qpk + row % qpk) * HD + d] : 0.0f;
            }
            __syncthreads();
            float acc[8][4], mx[8];
            kv_scores<HD, KW>(kp, qs, nv, scale, lane, warp, acc, mx);
            __syncthreads();  // everyone is done with K: kp becomes P
            kv_write_p(acc, nv, mx, P, lane, warp);
            __syncthreads();
            kv_l_part(P, lsh, lane, warp);
            float o[8][DL];
            kv_pv<HD>(P, vs, nv, nvmin, nvmax, lane, warp, o);
            kv_store_om<HD>(part, o, mx, nv, tz, qpk, kvh, n_head, max_chunks, c, lane, warp);
            __syncthreads();  // publishes lsh
            kv_store_l<HD>(part, lsh, tok, tz, qpk, G, r0, r1, k0, kvh, n_head, max_chunks, c, tid);
        }
        r0 = r1;
    }
}

extern "C" __global__ void __launch_bounds__(FC_ATT_THREADS) attn_partial_kv32(const float* qkv, int q_stride, int n_head, int n_kv, int hd, float scale,
                                                                              const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks) {
    attn_partial_kv_body<32>(qkv, q_stride, n_head, n_kv, scale, tok, n_tok, layer, part, max_chunks);
}
extern "C" __global__ void __launch_bounds__(FC_ATT_THREADS) attn_partial_kv64(const float* qkv, int q_stride, int n_head, int n_kv, int hd, float scale,
                                                                              const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks) {
    attn_partial_kv_body<64>(qkv, q_stride, n_head, n_kv, scale, tok, n_tok, layer, part, max_chunks);
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

// attn_partial_kv{32,64} and attn_merge in one kernel (prefill): one CTA per (KV head, group of
// 32 / qpk tokens) walks all the chunks of its rows in chunk order, each chunk computed exactly
// as attn_partial_kv_body does (every row's float steps attn_partial's, in its order; the
// partials written to `part` as there), then merges its rows' partials as attn_merge does (the
// max over chunks, f_c = exp(m_c - max), the sum of l_c * f_c in chunk order, 1 / l, each
// dimension's sum of o_c * f_c in chunk order, * (1 / l), and the q8 blocks): a token's bits are
// the one-token kernels'. The query rows are loaded once per run; the next chunk's keys arrive
// (cp.async on NVIDIA sm_80+) while the warps compute this chunk's P.V, its values while they
// compute the next scores. K is kept in 8-byte pieces, HD / 2 + 2 words per key (a half warp's
// 64-bit reads of 16 keys hit 32 distinct banks); P has its own buffer. Groups run last first
// (in a prefill the later tokens have the most chunks). Grid (n_kv, ceil(n_tok / G)),
// FC_ATT_THREADS threads, FC_ATT_FUSED_SHARED(HD) bytes of dynamic shared memory (3 CTAs per SM);
// 12 arguments (the runtimes' most): no hd (HD is the kernel's), attq null for no q8 blocks.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FC_ATT_ASYNC 1
#endif
template <int BYTES>
FC_DEV void att_cp(void* dst, const void* src) {
#ifdef FC_ATT_ASYNC
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "n"(BYTES));
#else
    if (BYTES == 16) {
        *(uint4*)dst = *(const uint4*)src;
    } else {
        *(uint2*)dst = *(const uint2*)src;
    }
#endif
}
FC_DEV void att_cp_commit() {
#ifdef FC_ATT_ASYNC
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until at most one of this thread's newest copy groups is still in flight.
FC_DEV void att_cp_wait1() {
#ifdef FC_ATT_ASYNC
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}

template <int HD>
FC_DEV void attn_fused_kv_body(const float* qkv, int q_stride, int n_head, int n_kv, float scale, const TokInfo* tok, int n_tok,
                               int layer, float* part, int max_chunks, float* att, BlockQ8* attq) {
    constexpr int KW = HD / 2 + 2;  // words per key of K
    constexpr int DL = HD / 32;     // dimensions per lane of the value sums
    extern __shared__ __align__(16) uint32_t fsm[];
    uint32_t* kp = fsm;                                             // [FC_ATT_CH][KW]
    uint16_t* vs = (uint16_t*)(kp + FC_ATT_CH * KW);                // [FC_ATT_CH][HD]
    float* P = (float*)(vs + FC_ATT_CH * HD);                       // [FC_ATT_CH][FC_ATT_PS]
    float* qs = P + FC_ATT_CH * FC_ATT_PS;                          // [FC_ATT_KR][HD]
    float(*lsh)[FC_ATT_KR] = (float(*)[FC_ATT_KR])(qs + FC_ATT_KR * HD);  // [4][FC_ATT_KR]
    const int kvh = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qpk = n_head / n_kv, G = FC_ATT_KR / qpk;
    const int tz = (gridDim.y - 1 - blockIdx.y) * G;
    const int tend = min(tz + G, n_tok);
    for (int r0 = tz; r0 < tend;) {
        const TokInfo first = tok[r0];
        int r1 = r0 + 1;
        while (r1 < tend && tok[r1].k == first.k && tok[r1].v == first.v && tok[r1].cap == first.cap) ++r1;
        int posmax = 0;
        for (int t = r0; t < r1; ++t) posmax = max(posmax, (int)tok[t].pos);
        const int nc = posmax / FC_ATT_CH + 1;
        const unsigned long long hbase = ((unsigned long long)layer * n_kv + kvh) * first.cap * HD;
        const uint16_t* kh = (const uint16_t*)first.k + hbase;
        const uint16_t* vh = (const uint16_t*)first.v + hbase;
        // chunk c's keys (those below the run's last position) into kp / its values into vs
        auto issue_k = [&](int c) {
            const int k0 = c * FC_ATT_CH, n = min(FC_ATT_CH, posmax + 1 - k0);
            for (int i = tid; i < n * (HD / 4); i += FC_ATT_THREADS) {
                const int j = i / (HD / 4), d4 = (i % (HD / 4)) * 4;
                att_cp<8>(kp + j * KW + d4 / 2, kh + (unsigned long long)(k0 + j) * HD + d4);
            }
            att_cp_commit();
        };
        auto issue_v = [&](int c) {
            const int k0 = c * FC_ATT_CH, n = min(FC_ATT_CH, posmax + 1 - k0);
            for (int i = tid; i < n * (HD / 8); i += FC_ATT_THREADS) {
                const int j = i / (HD / 8), d8 = (i % (HD / 8)) * 8;
                att_cp<16>(vs + j * HD + d8, vh + (unsigned long long)(k0 + j) * HD + d8);
            }
            att_cp_commit();
        };
        __syncthreads();  // the previous run is done with the shared arrays
        issue_k(0);
        issue_v(0);
        for (int i = tid; i < FC_ATT_KR * HD; i += FC_ATT_THREADS) {
            const int row = i / HD, d = i - row * HD, t = tz + row / qpk;
            qs[i] = row < G * qpk && t >= r0 && t < r1 ? qkv[(unsigned long long)t * q_stride + (kvh * qpk + row % qpk) * HD + d] : 0.0f;
        }
        for (int c = 0; c < nc; ++c) {
            const int k0 = c * FC_ATT_CH;
            const int nvmax = min(FC_ATT_CH, posmax + 1 - k0);
            int nv[8];
            const int nvmin = kv_row_keys(tok, tz, qpk, G, r0, r1, k0, warp, nv);
            att_cp_wait1();   // this chunk's keys (its values may still be in flight)
            __syncthreads();  // ... for every thread; the query rows too
            float acc[8][4], mx[8];
            kv_scores<HD, KW>(kp, qs, nv, scale, lane, warp, acc, mx);
            __syncthreads();  // everyone is done with K: the next chunk's keys may come
            if (c + 1 < nc) issue_k(c + 1);
            else att_cp_commit();  // an empty group: the waits count the same
            kv_write_p(acc, nv, mx, P, lane, warp);
            att_cp_wait1();   // this chunk's values (the next keys may still be in flight)
            __syncthreads();  // ... for every thread; P too
            kv_l_part(P, lsh, lane, warp);
            float o[8][DL];
            kv_pv<HD>(P, vs, nv, nvmin, nvmax, lane, warp, o);
            kv_store_om<HD>(part, o, mx, nv, tz, qpk, kvh, n_head, max_chunks, c, lane, warp);
            __syncthreads();  // publishes lsh; everyone is done with V and P
            if (c + 1 < nc) issue_v(c + 1);
            else att_cp_commit();
            kv_store_l<HD>(part, lsh, tok, tz, qpk, G, r0, r1, k0, kvh, n_head, max_chunks, c, tid);
        }
        r0 = r1;
    }
    __syncthreads();  // every row's partials are written (and visible to the whole CTA)
    // attn_merge for this warp's rows: lane holds dimensions lane + 32 x
    const int qd = n_head * HD;
#pragma unroll 1
    for (int r = 0; r < 8; ++r) {
        const int row = 8 * warp + r, t = tz + row / qpk;
        if (row >= G * qpk || t >= tend) continue;  // uniform over the warp
        const int h = kvh * qpk + row % qpk;
        const int nc = ((int)tok[t].pos + FC_ATT_CH) / FC_ATT_CH;
        const float* ph = part + ((unsigned long long)t * n_head + h) * max_chunks * (HD + 2);
        float mx = ph[HD];
        for (int c = 1; c < nc; ++c) mx = fmaxf(mx, ph[c * (HD + 2) + HD]);
        float l = __fmul_rn(ph[HD + 1], expf(__fsub_rn(ph[HD], mx)));
        for (int c = 1; c < nc; ++c) l = __fadd_rn(l, __fmul_rn(ph[c * (HD + 2) + HD + 1], expf(__fsub_rn(ph[c * (HD + 2) + HD], mx))));
        const float inv = 1.0f / l;
        float o[DL];
#pragma unroll
        for (int x = 0; x < DL; ++x) o[x] = 0.0f;
        for (int c = 0; c < nc; ++c) {
            const float f = expf(__fsub_rn(ph[c * (HD + 2) + HD], mx));
#pragma unroll
            for (int x = 0; x < DL; ++x) o[x] = __fmaf_rn(ph[c * (HD + 2) + lane + 32 * x], f, o[x]);
        }
        float* orow = att + (unsigned long long)t * qd + h * HD;
#pragma unroll
        for (int x = 0; x < DL; ++x) {
            const float y = __fmul_rn(o[x], inv);
            orow[lane + 32 * x] = y;
            if (attq) quantize_warp_q8(y, attq + (unsigned long long)t * (qd / 32) + (h * HD) / 32 + x);
        }
    }
}

// Dynamic shared memory of attn_fused_kv_body<HD>: K, V, P, the query rows and the l partials.
#define FC_ATT_FUSED_SHARED(HD) (FC_ATT_CH * (HD / 2 + 2) * 4 + FC_ATT_CH * HD * 2 + FC_ATT_CH * FC_ATT_PS * 4 + FC_ATT_KR * HD * 4 + 4 * FC_ATT_KR * 4)

extern "C" __global__ void __launch_bounds__(FC_ATT_THREADS, 3) attn_fused_kv32(const float* qkv, int q_stride, int n_head, int n_kv, float scale,
                                                                            const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks,
                                                                            float* att, BlockQ8* attq) {
    attn_fused_kv_body<32>(qkv, q_stride, n_head, n_kv, scale, tok, n_tok, layer, part, max_chunks, att, attq);
}
extern "C" __global__ void __launch_bounds__(FC_ATT_THREADS, 3) attn_fused_kv64(const float* qkv, int q_stride, int n_head, int n_kv, float scale,
                                                                            const TokInfo* tok, int n_tok, int layer, float* part, int max_chunks,
                                                                            float* att, BlockQ8* attq) {
    attn_fused_kv_body<64>(qkv, q_stride, n_head, n_kv, scale, tok, n_tok, layer, part, max_chunks, att, attq);
}
