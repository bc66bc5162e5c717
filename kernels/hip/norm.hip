// RMSNorm and activation quantization. One CTA of 256 threads per token row (or per slice of
// one); the row's sum of squares is a block_sum in a fixed order, so a token's result never
// depends on its batch or on how its row is split over CTAs.
#pragma once
#include "common.h"

#define FC_NORM_THREADS 256
// Slices of 256 elements a thread keeps in registers between the sum and the output (rows up
// to 4096 wide are read once; wider rows read the rest again).
#define FC_NORM_REG 16

// The output of element i = y * 256 + tid of a row: (v * scale) * w (the CPU's arithmetic),
// into xn (when given) and, with q8, one q8 block per warp (e % 32 == 0).
FC_DEV void rmsnorm_out(float xv, int i, int e, float scale, const float* w, float* xn, BlockQ8* xq, int q8) {
    const float v = i < e ? __fmul_rn(__fmul_rn(xv, scale), w[i]) : 0.0f;
    if (xn && i < e) xn[i] = v;
    if (q8 && i - (int)(threadIdx.x & 31) < e) quantize_warp_q8(v, xq + i / 32);
}

// xn[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; with q8, also xq[t] = those values quantized in
// blocks of 32 (e % 32 == 0). xn may be null (only the q8 blocks are wanted). rows: null, or the
// row of x each output row t reads (the output head's gather). Grid (n, ceil(slices / spc)) with
// slices = ceil(e / 256): every CTA computes its row's scale the same way (thread tid sums
// x[tid], x[tid + 256], ... in that order, then one block_sum), then writes `spc` slices of 256
// elements (8 q8 blocks each, one per warp). spc = 1 spreads a row over many CTAs (decode);
// spc = slices reads the row once (prefill). The same bits either way.
extern "C" __global__ void rmsnorm_q8(const float* x, const float* w, int e, float eps, float* xn, BlockQ8* xq, int q8, int spc, const uint32_t* rows) {
    __shared__ float scratch[FC_NORM_THREADS / 32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float* xr = x + (unsigned long long)(rows ? rows[t] : t) * e;
    float* xnr = xn ? xn + (unsigned long long)t * e : nullptr;
    BlockQ8* xqr = xq + (unsigned long long)t * (e / 32);
    if (spc == 1) {
        // one slice per CTA (decode): the row's sum, then one element per thread
        float ss = 0.0f;
        for (int i = tid; i < e; i += FC_NORM_THREADS) ss = __fmaf_rn(xr[i], xr[i], ss);
        ss = block_sum(ss, scratch, FC_NORM_THREADS / 32);
        const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)e, eps));
        const int i = blockIdx.y * FC_NORM_THREADS + tid;
        rmsnorm_out(i < e ? xr[i] : 0.0f, i, e, scale, w, xnr, xqr, q8);
        return;
    }
    // several slices per CTA (prefill): the row read once, its first FC_NORM_REG slices kept
    float xv[FC_NORM_REG];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < FC_NORM_REG; ++k) {
        const int i = k * FC_NORM_THREADS + tid;
        xv[k] = i < e ? xr[i] : 0.0f;
        if (i < e) ss = __fmaf_rn(xv[k], xv[k], ss);
    }
    for (int i = FC_NORM_REG * FC_NORM_THREADS + tid; i < e; i += FC_NORM_THREADS) ss = __fmaf_rn(xr[i], xr[i], ss);
    ss = block_sum(ss, scratch, FC_NORM_THREADS / 32);
    const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)e, eps));
    const int slices = (e + FC_NORM_THREADS - 1) / FC_NORM_THREADS;
    const int y0 = blockIdx.y * spc, y1 = min(y0 + spc, slices);
#pragma unroll
    for (int k = 0; k < FC_NORM_REG; ++k)
        if (k >= y0 && k < y1) rmsnorm_out(xv[k], k * FC_NORM_THREADS + tid, e, scale, w, xnr, xqr, q8);
    for (int k = max(y0, FC_NORM_REG); k < y1; ++k) {
        const int i = k * FC_NORM_THREADS + tid;
        rmsnorm_out(i < e ? xr[i] : 0.0f, i, e, scale, w, xnr, xqr, q8);
    }
}

// xq[t] = x[t] quantized in blocks of 32 (cols % 32 == 0); one CTA per row.
extern "C" __global__ void quantize_q8(const float* x, int cols, BlockQ8* xq) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < cols / 32; b += blockDim.x >> 5)
        quantize_warp_q8(x[(unsigned long long)t * cols + 32 * b + lane], xq + (unsigned long long)t * (cols / 32) + b);
}
