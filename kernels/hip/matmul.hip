// Dequantizing matrix products, out[t, r] (=|+=) sum_c W[r, c] * x[t, c], for every weight type
// of quants.hip: one body for the matrix-vector (decode) and matrix-matrix (prefill) cases, in one
// of two summation orders per type. Every kernel of a type gives each (row, token) the same bits,
// whatever the tile, grid or other tokens: decode equals prefill (batch invariance).
//
// Lane order (float types, Q4_K, Q6_K; mm_body): a row of W is nb blocks = nb * NI items. The L
// lanes of a row group (blockDim.x = L, a multiple of 32 chosen by the host from the matrix's
// shape alone) take items i = lane, lane + L, ... and accumulate them in that order; the lanes'
// sums meet in a warp butterfly, then the warps' sums in warp order. Each of the blockDim.y row
// groups of a CTA does R rows for T tokens at once: the item's weights are unpacked once and used
// for all T tokens, which is what makes the T > 1 variants fast.
//
// Q8 order (Q4_0, Q4_1, Q8_0; mmq_body and the tensor-core mmq_mma_body): the row's blocks are
// dealt to FC_QS = 8 segments, segment s the blocks s, s + 8, s + 16, ..., summed in that order
// from 0 by W::combine (one rounding step per block: acc + (d_w * d_x) * isum, isum the block's
// exact integer dot product); the 8 segment sums p0..p7 meet as a butterfly xor 4, 2, 1, i.e.
// ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7)). The one-token kernel runs a segment per
// lane (8 lanes per row; the one-token kernel 4 lanes per segment, adding their exact integer
// sums first); the tensor-core kernel a segment per warp (8 warps on one 64-row x
// 32-token tile, split over K), each warp's mma giving exact per-block integer sums. Since the
// integer sums are exact, the two orders of float steps are the same and so are the bits.
#pragma once
#include "quants.hip"

#define EPI_STORE 0
#define EPI_ADD 1

#define FC_MM_PARAMS                                                                               \
    const uint8_t *w, unsigned long long row_bytes, int rows, int nb, const void *x, int xs, int n_tok, \
        float *out, int ldo
#define FC_MM_ARGS(W) w, row_bytes, rows, nb, (const typename W::Act*)x, xs, n_tok, out, ldo

// ---- Lane order ----------------------------------------------------------------------------
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

// ---- Q8 order: one segment per lane ----------------------------------------------------------
#define FC_QS 8

// blockDim = (FC_QS, G), G a multiple of 4 (whole warps); row group y does R rows x T tokens,
// lane s its segment, U blocks of weights in flight per lane.
template <class W, int R, int T, int U, int EPI>
FC_DEV void mmq_body(const uint8_t* __restrict__ w, unsigned long long row_bytes, int rows, int nb,
                     const BlockQ8* __restrict__ x, int xs, int n_tok, float* __restrict__ out, int ldo) {
    const int s = threadIdx.x;
    const int r0 = (blockIdx.x * blockDim.y + threadIdx.y) * R;
    const int t0 = blockIdx.y * T;
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = w + (unsigned long long)min(r0 + r, rows - 1) * row_bytes;
    const BlockQ8* xt[T];
#pragma unroll
    for (int t = 0; t < T; ++t) xt[t] = x + (unsigned long long)min(t0 + t, n_tok - 1) * xs;
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
    for (int b0 = s; b0 < nb; b0 += U * FC_QS) {
        int q[U][R][8];
        float d[U][R], m[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * FC_QS;
            if (b < nb) {
#pragma unroll
                for (int r = 0; r < R; ++r) W::qblock(wr[r] + (unsigned long long)b * W::BB, q[u][r], &d[u][r], &m[u][r]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * FC_QS;
            if (b < nb) {
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    const BlockQ8* xb = xt[t] + b;
                    const float2 ds = *(const float2*)xb;
                    const int2 a0 = ld_x8(xb->qs), a1 = ld_x8(xb->qs + 8), a2 = ld_x8(xb->qs + 16), a3 = ld_x8(xb->qs + 24);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        const int* qq = q[u][r];
                        int is = dot4(qq[0], a0.x, 0);
                        is = dot4(qq[1], a0.y, is); is = dot4(qq[2], a1.x, is); is = dot4(qq[3], a1.y, is);
                        is = dot4(qq[4], a2.x, is); is = dot4(qq[5], a2.y, is); is = dot4(qq[6], a3.x, is); is = dot4(qq[7], a3.y, is);
                        acc[r][t] = W::combine(acc[r][t], d[u][r], m[u][r], ds.x, ds.y, (float)is);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
            for (int k = FC_QS / 2; k > 0; k >>= 1) acc[r][t] = __fadd_rn(acc[r][t], FC_SHFL_XOR(acc[r][t], k));
        }
    if (s == 0) {
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

// One token, one row per warp: lane = 4 * segment + k, the 4 lanes of a segment each take words
// k and 4 + k of its blocks and add their integer sums exactly (shuffles), then all 4 take the
// same float step; the segment tree is the lane butterfly xor 16, 8, 4. blockDim = (32, G).
template <class W, int U, int EPI>
FC_DEV void mmq_row_body(const uint8_t* __restrict__ w, unsigned long long row_bytes, int rows, int nb,
                         const BlockQ8* __restrict__ x, int xs, int n_tok, float* __restrict__ out, int ldo) {
    const int lane = threadIdx.x, seg = lane >> 2, k = lane & 3;
    const int r = blockIdx.x * blockDim.y + threadIdx.y, t = blockIdx.y;
    const uint8_t* wr = w + (unsigned long long)min(r, rows - 1) * row_bytes;
    const BlockQ8* xt = x + (unsigned long long)t * xs;
    float acc = 0.0f;
    // the same trip count on every lane (the shuffles need the whole warp)
    for (int b0 = 0; b0 < nb; b0 += U * FC_QS) {
        int lo[U], hi[U], is[U];
        float d[U], m[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * FC_QS + seg;
            if (b < nb) W::qpart(wr + (unsigned long long)b * W::BB, k, &lo[u], &hi[u], &d[u], &m[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * FC_QS + seg;
            is[u] = b < nb ? dot4(hi[u], ld_x4(xt[b].qs + 16 + 4 * k), dot4(lo[u], ld_x4(xt[b].qs + 4 * k), 0)) : 0;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            is[u] += FC_SHFL_XOR(is[u], 1);
            is[u] += FC_SHFL_XOR(is[u], 2);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = b0 + u * FC_QS + seg;
            if (b < nb) {
                const float2 ds = *(const float2*)(xt + b);
                acc = W::combine(acc, d[u], m[u], ds.x, ds.y, (float)is[u]);
            }
        }
    }
    acc = __fadd_rn(acc, FC_SHFL_XOR(acc, 16));
    acc = __fadd_rn(acc, FC_SHFL_XOR(acc, 8));
    acc = __fadd_rn(acc, FC_SHFL_XOR(acc, 4));
    if (lane == 0 && r < rows) {
        float* o = out + (unsigned long long)t * ldo + r;
        *o = EPI == EPI_ADD ? __fadd_rn(*o, acc) : acc;
    }
}
#define FC_MMQ_ROW(name, W, U)                                                                                    \
    extern "C" __global__ void mm_##name##_t1_store(FC_MM_PARAMS) { mmq_row_body<W, U, EPI_STORE>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void mm_##name##_t1_add(FC_MM_PARAMS) { mmq_row_body<W, U, EPI_ADD>(FC_MM_ARGS(W)); }

// ---- Q8 order on tensor cores (NVIDIA sm_80+; elsewhere the host never launches it) -----------
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define FC_MMA 1
// c = 0x4B400000 + the 16x8 int32 product of a 16x32 s8 tile (row-major) and a 32x8 s8 tile
// (column-major): the accumulator starts at the bits of 1.5 * 2^23, so each c is the float
// 1.5 * 2^23 + v exactly (|v| < 2^22) and magic_f turns it into (float)v with one subtraction.
FC_DEV void mma_s8_16x8x32(int* c, int a0, int a1, int a2, int a3, int b0, int b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0x4B400000));
}
#endif

#define FC_MMA_BM 64
#define FC_MMA_BN 32
// (float)v, exactly, from mma_s8_16x8x32's c = 0x4B400000 + v (|v| < 2^22), without the slow
// int-to-float conversion.
FC_DEV float magic_f(int c) { return __fsub_rn(__int_as_float(c), 12582912.0f); }

// The tile's inputs are copied into shared memory as they are stored (no unpacking on the way):
// a chunk of 8 blocks of each of the 64 rows (8 * BB bytes), and of each of the 32 tokens (8
// BlockQ8s, 320 bytes), in 16-byte pieces, each read with one coalesced 16-byte load where the
// matrix allows it (else 4- or 2-byte loads, same bytes). The fragments are then read from those
// copies with the one-token kernel's W::qpart, so they are the same words as ever.
// Row stride in words: a multiple of 4 (whole pieces) that is 4 mod 8, so that the 8 rows x 4
// words of a fragment load fall in 32 different banks; tokens likewise (80 words + 4).
template <class W>
struct MmaRaw {
    static constexpr int PR = (8 * W::BB + 15) / 16;                     // pieces per row
    static constexpr int SWW = (PR * 4) % 8 == 0 ? PR * 4 + 4 : PR * 4;  // words per row
    static constexpr int NPW = (FC_MMA_BM * PR + 255) / 256;             // pieces per thread
};
#define FC_MMA_XPR 20   // pieces per token (8 x 40 bytes)
#define FC_MMA_XWW 84   // words per token in shared memory
#define FC_MMA_NPX ((FC_MMA_BN * FC_MMA_XPR + 255) / 256)

// The alignment every piece of a matrix shares: 16 (one 16-byte load), 4 or 2 bytes.
FC_DEV int piece_align(unsigned long long base, unsigned long long stride, unsigned long long len) {
    const unsigned long long a = base | stride | len;
    return (a & 15) == 0 ? 16 : (a & 3) == 0 ? 4 : 2;
}
// The 16 bytes at p, or those of them below p + avail (the rest zero); al: piece_align's answer.
FC_DEV int4 ld_piece(const uint8_t* p, int avail, int al) {
    if (al == 16 && avail >= 16) return *(const int4*)p;
    uint32_t v[4];
    if (al >= 4) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = 4 * j + 4 <= avail ? ((const uint32_t*)p)[j] : 0u;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t lo = 4 * j + 2 <= avail ? ld_u16(p + 4 * j) : 0u;
            const uint32_t hi = 4 * j + 4 <= avail ? ld_u16(p + 4 * j + 2) : 0u;
            v[j] = lo | (hi << 16);
        }
    }
    return make_int4((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
}
#ifdef FC_MMA
// ld_piece into shared memory: a 16-byte piece asynchronously (cp.async, no registers; complete
// after cp_async_wait), any other synchronously.
FC_DEV void cp_piece(int4* dst, const uint8_t* p, int avail, int al) {
    if (al == 16 && avail >= 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(p));
    } else {
        *dst = ld_piece(p, avail, al);
    }
}
FC_DEV void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
FC_DEV void cp_async_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Waits until at most n of this thread's newest groups are still in flight.
template <int N>
FC_DEV void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
#endif

// 256 threads (8 warps) per 64-row x 32-token tile. K runs in chunks of 8 blocks: every thread
// loads its pieces of the next chunk (weights into registers, then shared memory; activations
// straight into the other of two shared buffers) while the warps work on this one; warp w multiplies block w of the chunk, i.e. its segment, and
// keeps 64 sums per lane.
template <class W, int EPI>
FC_DEV void mmq_mma_body(const uint8_t* __restrict__ w, unsigned long long row_bytes, int rows, int nb,
                         const BlockQ8* __restrict__ x, int xs, int n_tok, float* __restrict__ out, int ldo) {
#ifdef FC_MMA
    typedef MmaRaw<W> R;
    // tiles: wraw [64][SWW] words (at most 17 KiB), xraw [2][32][84] words (2 x 10.5 KiB: the
    // activations of the next chunk arrive by cp.async while the warps read this one's);
    // afterwards the segment sums: red [8][32 tokens][36] (36 KiB)
    constexpr int TILE_WORDS = FC_MMA_BM * R::SWW + 2 * FC_MMA_BN * FC_MMA_XWW, RED_WORDS = 8 * 32 * 36;
    __shared__ int4 smem[(TILE_WORDS > RED_WORDS ? TILE_WORDS : RED_WORDS) / 4];
    int4* wraw = smem;
    int4* xraw0 = smem + FC_MMA_BM * R::SWW / 4;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    const int r0 = blockIdx.x * FC_MMA_BM, t0 = blockIdx.y * FC_MMA_BN;
    const int nc = (nb + 7) >> 3;
    const int wlen = nb * W::BB, xlen = nb * (int)sizeof(BlockQ8);
    const int wal = piece_align((unsigned long long)w, row_bytes, (unsigned long long)wlen);
    const int xal = piece_align((unsigned long long)x, (unsigned long long)xs * sizeof(BlockQ8), (unsigned long long)xlen);

    int4 gw[R::NPW];
    auto fetch = [&](int c) {
#pragma unroll
        for (int k = 0; k < R::NPW; ++k) {
            const int p = tid + 256 * k, row = p / R::PR, o = c * 8 * W::BB + 16 * (p % R::PR);
            if (p < FC_MMA_BM * R::PR) {
                const uint8_t* src = w + (unsigned long long)min(r0 + row, rows - 1) * row_bytes + o;
                gw[k] = ld_piece(src, wlen - o, wal);
            }
        }
        int4* xraw = xraw0 + (c & 1) * (FC_MMA_BN * FC_MMA_XWW / 4);
#pragma unroll
        for (int k = 0; k < FC_MMA_NPX; ++k) {
            const int p = tid + 256 * k, tok = p / FC_MMA_XPR, o = c * 8 * (int)sizeof(BlockQ8) + 16 * (p % FC_MMA_XPR);
            if (p < FC_MMA_BN * FC_MMA_XPR) {
                const uint8_t* src = (const uint8_t*)(x + (unsigned long long)min(t0 + tok, n_tok - 1) * xs) + o;
                cp_piece(xraw + tok * (FC_MMA_XWW / 4) + p % FC_MMA_XPR, src, xlen - o, xal);
            }
        }
        cp_async_commit();
    };

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

    fetch(0);
    for (int c = 0; c < nc; ++c) {
        __syncthreads();
#pragma unroll
        for (int k = 0; k < R::NPW; ++k) {
            const int p = tid + 256 * k;
            if (p < FC_MMA_BM * R::PR) wraw[(p / R::PR) * (R::SWW / 4) + p % R::PR] = gw[k];
        }
        cp_async_wait();
        __syncthreads();
        if (c + 1 < nc) fetch(c + 1);
        const int4* xraw = xraw0 + (c & 1) * (FC_MMA_BN * FC_MMA_XWW / 4);
        if (8 * c + warp < nb) {
            const int* xw = (const int*)xraw + warp * (int)(sizeof(BlockQ8) / 4);  // block `warp` of token 0
            int b0[4], b1[4];
            float dx0[4], dx1[4], sx0[4], sx1[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int* xn = xw + (8 * j + g) * FC_MMA_XWW;
                b0[j] = xn[2 + tig];  // qs words tig and 4 + tig (qs at byte 8)
                b1[j] = xn[6 + tig];
                const float2 s0 = *(const float2*)(xw + (8 * j + 2 * tig) * FC_MMA_XWW);
                const float2 s1 = *(const float2*)(xw + (8 * j + 2 * tig + 1) * FC_MMA_XWW);
                dx0[j] = s0.x;
                sx0[j] = s0.y;
                dx1[j] = s1.x;
                sx1[j] = s1.y;
            }
            const uint8_t* wb = (const uint8_t*)wraw + warp * W::BB;  // block `warp` of row 0
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = 16 * i + g;
                int a0, a1, a2, a3;
                float d0, d1, m0, m1;
                W::qpart(wb + m * R::SWW * 4, tig, &a0, &a2, &d0, &m0);
                W::qpart(wb + (m + 8) * R::SWW * 4, tig, &a1, &a3, &d1, &m1);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    int cc[4];
                    mma_s8_16x8x32(cc, a0, a1, a2, a3, b0[j], b1[j]);
                    acc[i][j][0] = W::combine(acc[i][j][0], d0, m0, dx0[j], sx0[j], magic_f(cc[0]));
                    acc[i][j][1] = W::combine(acc[i][j][1], d0, m0, dx1[j], sx1[j], magic_f(cc[1]));
                    acc[i][j][2] = W::combine(acc[i][j][2], d1, m1, dx0[j], sx0[j], magic_f(cc[2]));
                    acc[i][j][3] = W::combine(acc[i][j][3], d1, m1, dx1[j], sx1[j], magic_f(cc[3]));
                }
            }
        }
    }

    // the 8 segment sums of each (row, token) meet in the one-token kernel's tree, 32 rows at a time
    float* red = (float*)smem;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        __syncthreads();
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
            const int lr = 16 * ii + g;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = 8 * j + 2 * tig;
                float* rw = red + (warp * 32 + n) * 36 + lr;
                rw[0] = acc[2 * half + ii][j][0];
                rw[36] = acc[2 * half + ii][j][1];
                rw[8] = acc[2 * half + ii][j][2];
                rw[36 + 8] = acc[2 * half + ii][j][3];
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int idx = tid + 256 * k, lr = idx & 31, n = idx >> 5;
            float p[8];
#pragma unroll
            for (int v = 0; v < 8; ++v) p[v] = red[(v * 32 + n) * 36 + lr];
            const float val = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[4]), __fadd_rn(p[2], p[6])),
                                        __fadd_rn(__fadd_rn(p[1], p[5]), __fadd_rn(p[3], p[7])));
            const int row = r0 + 32 * half + lr, tok = t0 + n;
            if (row < rows && tok < n_tok) {
                float* o = out + (unsigned long long)tok * ldo + row;
                *o = EPI == EPI_ADD ? __fadd_rn(*o, val) : val;
            }
        }
    }
#endif
}



// ---- The 64 x 64 tensor-core tile (Tile::Mma64) ---------------------------------------------
// 512 threads (16 warps) per 64-row x 64-token tile, so each copy of a weight chunk in shared
// memory serves 64 tokens (twice mmq_mma_body's). Warp w takes segment s = w & 7 (block s of each
// chunk, as there) for rows 32 (w >> 3) .. + 32 and all 64 tokens: its weight fragments (the
// unpacking) serve 8 token groups instead of 4. Weights and activations both arrive by cp.async,
// FC_MMA64_ST chunks in flight (dynamic shared memory, FC_MMA64_SMEM bytes, which the host opts
// into). Same words into the same mma, same float steps in the same order: the same bits.
#define FC_MMA64_ST 3
#define FC_MMA64_RS 68                  // red's row stride (64 rows + 4: conflict-free writes)
#define FC_MMA64_SMEM (8 * 64 * FC_MMA64_RS * 4)  // the segment sums; more than any type's tile
template <class W, int EPI>
FC_DEV void mmq_mma64_body(const uint8_t* __restrict__ w, unsigned long long row_bytes, int rows, int nb,
                           const BlockQ8* __restrict__ x, int xs, int n_tok, float* __restrict__ out, int ldo) {
#ifdef FC_MMA
    typedef MmaRaw<W> R;
    constexpr int WST = FC_MMA_BM * R::SWW / 4;  // int4s per weight stage
    constexpr int XST = 64 * FC_MMA_XWW / 4;     // int4s per activation stage
    static_assert(FC_MMA64_ST * (WST + XST) * 16 <= FC_MMA64_SMEM, "tile larger than FC_MMA64_SMEM");
    extern __shared__ int4 dsm[];
    int4* wbuf = dsm;
    int4* xbuf = dsm + FC_MMA64_ST * WST;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    const int seg = warp & 7, rh = warp >> 3;
    const int r0 = blockIdx.x * 64, t0 = blockIdx.y * 64;
    const int nc = (nb + 7) >> 3;
    const int wlen = nb * W::BB, xlen = nb * (int)sizeof(BlockQ8);
    const int wal = piece_align((unsigned long long)w, row_bytes, (unsigned long long)wlen);
    const int xal = piece_align((unsigned long long)x, (unsigned long long)xs * sizeof(BlockQ8), (unsigned long long)xlen);

    // chunk c into stage c % FC_MMA64_ST, one commit group (empty past the last chunk)
    auto fetch = [&](int c) {
        if (c < nc) {
            int4* wd = wbuf + (c % FC_MMA64_ST) * WST;
#pragma unroll
            for (int k = 0; k < (FC_MMA_BM * R::PR + 511) / 512; ++k) {
                const int p = tid + 512 * k, row = p / R::PR, o = c * 8 * W::BB + 16 * (p % R::PR);
                if (p < FC_MMA_BM * R::PR)
                    cp_piece(wd + row * (R::SWW / 4) + p % R::PR, w + (unsigned long long)min(r0 + row, rows - 1) * row_bytes + o, wlen - o, wal);
            }
            int4* xd = xbuf + (c % FC_MMA64_ST) * XST;
#pragma unroll
            for (int k = 0; k < (64 * FC_MMA_XPR + 511) / 512; ++k) {
                const int p = tid + 512 * k, tok = p / FC_MMA_XPR, o = c * 8 * (int)sizeof(BlockQ8) + 16 * (p % FC_MMA_XPR);
                if (p < 64 * FC_MMA_XPR) {
                    const uint8_t* src = (const uint8_t*)(x + (unsigned long long)min(t0 + tok, n_tok - 1) * xs) + o;
                    cp_piece(xd + tok * (FC_MMA_XWW / 4) + p % FC_MMA_XPR, src, xlen - o, xal);
                }
            }
        }
        cp_async_commit();
    };

    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

#pragma unroll
    for (int c = 0; c < FC_MMA64_ST - 1; ++c) fetch(c);
    for (int c = 0; c < nc; ++c) {
        cp_async_wait_group<FC_MMA64_ST - 2>();  // this thread's pieces of chunk c are in
        __syncthreads();                         // everyone's are; stage (c - 1) % ST is free
        fetch(c + FC_MMA64_ST - 1);
        if (8 * c + seg < nb) {
            const int st = c % FC_MMA64_ST;
            const uint8_t* wb = (const uint8_t*)(wbuf + st * WST) + seg * W::BB;  // block `seg` of row 0
            int a[2][4];
            float d[2][2], m[2][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int mr = 32 * rh + 16 * i + g;
                W::qpart(wb + mr * R::SWW * 4, tig, &a[i][0], &a[i][2], &d[i][0], &m[i][0]);
                W::qpart(wb + (mr + 8) * R::SWW * 4, tig, &a[i][1], &a[i][3], &d[i][1], &m[i][1]);
            }
            const int* xw = (const int*)(xbuf + st * XST) + seg * (int)(sizeof(BlockQ8) / 4);  // block `seg` of token 0
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int* xn = xw + (8 * j + g) * FC_MMA_XWW;
                const int b0 = xn[2 + tig], b1 = xn[6 + tig];  // qs words tig and 4 + tig
                const float2 s0 = *(const float2*)(xw + (8 * j + 2 * tig) * FC_MMA_XWW);
                const float2 s1 = *(const float2*)(xw + (8 * j + 2 * tig + 1) * FC_MMA_XWW);
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    int cc[4];
                    mma_s8_16x8x32(cc, a[i][0], a[i][1], a[i][2], a[i][3], b0, b1);
                    acc[i][j][0] = W::combine(acc[i][j][0], d[i][0], m[i][0], s0.x, s0.y, magic_f(cc[0]));
                    acc[i][j][1] = W::combine(acc[i][j][1], d[i][0], m[i][0], s1.x, s1.y, magic_f(cc[1]));
                    acc[i][j][2] = W::combine(acc[i][j][2], d[i][1], m[i][1], s0.x, s0.y, magic_f(cc[2]));
                    acc[i][j][3] = W::combine(acc[i][j][3], d[i][1], m[i][1], s1.x, s1.y, magic_f(cc[3]));
                }
            }
        }
    }

    // the 8 segment sums of each (row, token) meet in the one-token kernel's tree
    cp_async_wait();
    __syncthreads();
    float* red = (float*)dsm;  // [8 segments][64 tokens][FC_MMA64_RS]
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int lr = 32 * rh + 16 * i + g;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            float* rw = red + (seg * 64 + 8 * j + 2 * tig) * FC_MMA64_RS + lr;
            rw[0] = acc[i][j][0];
            rw[FC_MMA64_RS] = acc[i][j][1];
            rw[8] = acc[i][j][2];
            rw[FC_MMA64_RS + 8] = acc[i][j][3];
        }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int idx = tid + 512 * k, lr = idx & 63, n = idx >> 6;
        float p[8];
#pragma unroll
        for (int v = 0; v < 8; ++v) p[v] = red[(v * 64 + n) * FC_MMA64_RS + lr];
        const float val = __fadd_rn(__fadd_rn(__fadd_rn(p[0], p[4]), __fadd_rn(p[2], p[6])),
                                    __fadd_rn(__fadd_rn(p[1], p[5]), __fadd_rn(p[3], p[7])));
        const int row = r0 + lr, tok = t0 + n;
        if (row < rows && tok < n_tok) {
            float* o = out + (unsigned long long)tok * ldo + row;
            *o = EPI == EPI_ADD ? __fadd_rn(*o, val) : val;
        }
    }
#endif
}


// Tile variants (R rows x T tokens per row group, U items/blocks in flight per lane): t1 for one
// token, t4, t8 and t16 for batches; for the q8-order types also mma and mma64 (tensor cores,
// 64 x 32 and 64 x 64).
#define FC_MM_VARIANT(name, body, W, tag, R, T, U)                                                            \
    extern "C" __global__ void mm_##name##_##tag##_store(FC_MM_PARAMS) { body<W, R, T, U, EPI_STORE>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void mm_##name##_##tag##_add(FC_MM_PARAMS) { body<W, R, T, U, EPI_ADD>(FC_MM_ARGS(W)); }
#define FC_MM_KERNELS(name, W)                      \
    FC_MM_VARIANT(name, mm_body, W, t1, 1, 1, 4)    \
    FC_MM_VARIANT(name, mm_body, W, t4, 2, 4, 2)    \
    FC_MM_VARIANT(name, mm_body, W, t8, 4, 8, 1)    \
    FC_MM_VARIANT(name, mm_body, W, t16, 4, 16, 1)
#define FC_MMQ_KERNELS(name, W)                                                                                 \
    FC_MMQ_ROW(name, W, 8)                                                                                      \
    FC_MM_VARIANT(name, mmq_body, W, t4, 2, 4, 2)                                                               \
    FC_MM_VARIANT(name, mmq_body, W, t8, 4, 8, 1)                                                               \
    FC_MM_VARIANT(name, mmq_body, W, t16, 4, 16, 1)                                                             \
    extern "C" __global__ void __launch_bounds__(256, 2) mm_##name##_mma_store(FC_MM_PARAMS) { mmq_mma_body<W, EPI_STORE>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void __launch_bounds__(256, 2) mm_##name##_mma_add(FC_MM_PARAMS) { mmq_mma_body<W, EPI_ADD>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void __launch_bounds__(512, 1) mm_##name##_mma64_store(FC_MM_PARAMS) { mmq_mma64_body<W, EPI_STORE>(FC_MM_ARGS(W)); } \
    extern "C" __global__ void __launch_bounds__(512, 1) mm_##name##_mma64_add(FC_MM_PARAMS) { mmq_mma64_body<W, EPI_ADD>(FC_MM_ARGS(W)); }

// Which order each type of quants.hip's FC_WEIGHT_TYPES takes.
FC_MM_KERNELS(f32, WF32)
FC_MM_KERNELS(f16, WF16)
FC_MM_KERNELS(bf16, WBF16)
FC_MMQ_KERNELS(q4_0, WQ4_0)
FC_MMQ_KERNELS(q4_1, WQ4_1)
FC_MMQ_KERNELS(q8_0, WQ8_0)
FC_MM_KERNELS(q4_k, WQ4_K)
FC_MM_KERNELS(q6_k, WQ6_K)

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
