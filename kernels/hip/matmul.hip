// Dequantizing matrix products, out[t, r] (=|+=) sum_c W[r, c] * x[t, c], for every weight type
// of quants.hip: one body for the matrix-vector (decode) and matrix-matrix (prefill) cases.
//
// A row of W is nb blocks = nb * NI items. The L lanes of a row group (blockDim.x = L, a multiple
// of 32 chosen by the host from the matrix's shape alone) take items i = lane, lane + L, ... and
// accumulate them in that order; the lanes' sums meet in a warp butterfly, then the warps' sums in
// warp order. Each of the blockDim.y row groups of a CTA does R rows for T tokens at once: the
// item's weights are unpacked once and used for all T tokens, which is what makes the T > 1
// variants fast. Nothing in a (row, token) result depends on R, T, the grid or the other tokens,
// so every variant gives the same bits: decode equals prefill (batch invariance).
#pragma once
#include "quants.hip"

#define EPI_STORE 0
#define EPI_ADD 1

// w: [rows, row_bytes]; x: [n_tok, xs] activation units (W::Act); out: [n_tok, ldo] f32.
template <class W, int R, int T, int U, int EPI>
FC_DEV void mm_body(const uint8_t* __restrict__ w, unsigned long long row_bytes, int rows, int nb,
                    const typename W::Act* __restrict__ x, int xs, int n_tok, float* __restrict__ out, int ldo) {
    extern __shared__ float red[];  // [blockDim.y][R][T][L / 32]
    const int L = blockDim.x, G = blockDim.y, nw = L >> 5;
    const int lane = threadIdx.x, g = threadIdx.y;
    const int r0 = (blockIdx.x * G + g) * R;
    const int t0 = blockIdx.y * T;
    const int items = nb * W::NI;
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = w + (unsigned long long)min(r0 + r, rows - 1) * row_bytes;
    const typename W::Act* xt[T];
#pragma unroll
    for (int t = 0; t < T; ++t) xt[t] = x + (unsigned long long)min(t0 + t, n_tok - 1) * xs;
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    // U items per lane in flight (their loads issued before the first is used); the sums still
    // take the lane's items in order i = lane, lane + L, ...
    for (int i0 = lane; i0 < items; i0 += U * L) {
        typename W::Item it[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * L;
            if (i < items) {
#pragma unroll
                for (int r = 0; r < R; ++r) it[u][r] = W::load(wr[r] + (unsigned long long)(i / W::NI) * W::BB, i % W::NI);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = i0 + u * L;
            if (i < items) {
                const int b = i / W::NI, k = i % W::NI;
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int t = 0; t < T; ++t) acc[r][t] = __fadd_rn(acc[r][t], W::dot(it[u][r], k, xt[t] + (unsigned long long)b * W::XB));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if (nw > 1) {
        float* mine = red + (unsigned)g * R * T * nw;
        if ((lane & 31) == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < T; ++t) mine[(r * T + t) * nw + (lane >> 5)] = acc[r][t];
        }
        __syncthreads();
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    float s = mine[(r * T + t) * nw];
                    for (int j = 1; j < nw; ++j) s = __fadd_rn(s, mine[(r * T + t) * nw + j]);
                    acc[r][t] = s;
                }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) {
                if (r0 + r < rows && t0 + t < n_tok) {
                    float* o = out + (unsigned long long)(t0 + t) * ldo + r0 + r;
                    *o = EPI == EPI_ADD ? __fadd_rn(*o, acc[r][t]) : acc[r][t];
                }
            }
    }
}

#define FC_MM_PARAMS                                                                               \
    const uint8_t *w, unsigned long long row_bytes, int rows, int nb, const void *x, int xs, int n_tok, \
        float *out, int ldo
#define FC_MM_ARGS(W) w, row_bytes, rows, nb, (const typename W::Act*)x, xs, n_tok, out, ldo

// Tile variants (R rows x T tokens per row group, U items in flight per lane): t1 for one
// token, t4, t8 and t16 for batches.
#define FC_MM_VARIANT(name, W, tag, R, T, U)                                                                  \
    extern "C" __global__ void mm_##name##_##tag##_store(FC_MM_PARAMS) { mm_body<W, R, T, U, EPI_STORE>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void mm_##name##_##tag##_add(FC_MM_PARAMS) { mm_body<W, R, T, U, EPI_ADD>(FC_MM_ARGS(W)); }
#define FC_MM_KERNELS(name, W)             \
    FC_MM_VARIANT(name, W, t1, 1, 1, 4)    \
    FC_MM_VARIANT(name, W, t4, 2, 4, 2)    \
    FC_MM_VARIANT(name, W, t8, 4, 8, 1)    \
    FC_MM_VARIANT(name, W, t16, 4, 16, 1)

FC_WEIGHT_TYPES(FC_MM_KERNELS)

// Embedding lookup / dequantization: out[t, :] = row ids[t] of W, dequantized (the CPU's bits).
template <class W>
FC_DEV void embed_body(const uint8_t* w, unsigned long long row_bytes, const uint32_t* ids, int cols, float* out) {
    const int t = blockIdx.x;
    const uint8_t* row = w + (unsigned long long)ids[t] * row_bytes;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[(unsigned long long)t * cols + i] = W::value(row + (unsigned long long)(i / W::QB) * W::BB, i % W::QB);
}
#define FC_EMBED_KERNEL(name, W)                                                                      \
    extern "C" __global__ void embed_##name(const uint8_t* w, unsigned long long row_bytes, const uint32_t* ids, \
                                            int cols, float* out) {                                     \
        embed_body<W>(w, row_bytes, ids, cols, out);                                                    \
    }
FC_WEIGHT_TYPES(FC_EMBED_KERNEL)
