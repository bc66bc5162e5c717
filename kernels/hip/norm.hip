// RMSNorm and activation quantization. One CTA of 256 threads per token row; the row's sum of
// squares is a block_sum in a fixed order, so a token's result never depends on its batch.
#pragma once
#include "common.h"

#define FC_NORM_THREADS 256

// xn[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w (the CPU's arithmetic: (v * scale) * w); with q8,
// also xq[t] = xn[t] quantized in blocks of 32 (e % 32 == 0). Grid (n, ceil(e / 256)): every CTA
// of a row computes the row's scale the same way, then writes its 256 elements (8 q8 blocks, one
// per warp), so a long row is spread over many CTAs.
extern "C" __global__ void rmsnorm_q8(const float* x, const float* w, int e, float eps, float* xn, BlockQ8* xq, int q8) {
    __shared__ float scratch[FC_NORM_THREADS / 32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float* xr = x + (unsigned long long)t * e;
    float ss = 0.0f;
    for (int i = tid; i < e; i += FC_NORM_THREADS) ss = __fmaf_rn(xr[i], xr[i], ss);
    ss = block_sum(ss, scratch, FC_NORM_THREADS / 32);
    const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)e, eps));
    const int i = blockIdx.y * FC_NORM_THREADS + tid;
    const float v = i < e ? __fmul_rn(__fmul_rn(xr[i], scale), w[i]) : 0.0f;
    if (i < e) xn[(unsigned long long)t * e + i] = v;
    if (q8 && i - (tid & 31) < e) quantize_warp_q8(v, xq + (unsigned long long)t * (e / 32) + i / 32);
}

// xq[t] = x[t] quantized in blocks of 32 (cols % 32 == 0); one CTA per row.
extern "C" __global__ void quantize_q8(const float* x, int cols, BlockQ8* xq) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < cols / 32; b += blockDim.x >> 5)
        quantize_warp_q8(x[(unsigned long long)t * cols + 32 * b + lane], xq + (unsigned long long)t * (cols / 32) + b);
}
