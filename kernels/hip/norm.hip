// RMSNorm and activation quantization. One CTA of 256 threads per token row; the row's sum of
// squares is a block_sum in a fixed order, so a token's result never depends on its batch.
#pragma once
#include "common.h"

#define FC_NORM_THREADS 256

// xn[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w (the CPU's arithmetic: (v * scale) * w); with q8,
// also xq[t] = xn[t] quantized in blocks of 32 (e % 32 == 0).
extern "C" __global__ void rmsnorm_q8(const float* x, const float* w, int e, float eps, float* xn, BlockQ8* xq, int q8) {
    __shared__ float scratch[FC_NORM_THREADS / 32];
    const int t = blockIdx.x, tid = threadIdx.x;
    const float* xr = x + (unsigned long long)t * e;
    float ss = 0.0f;
    for (int i = tid; i < e; i += FC_NORM_THREADS) ss = __fmaf_rn(xr[i], xr[i], ss);
    ss = block_sum(ss, scratch, FC_NORM_THREADS / 32);
    const float scale = 1.0f / sqrtf(__fadd_rn(ss / (float)e, eps));
    for (int i = tid; i < e; i += FC_NORM_THREADS) xn[(unsigned long long)t * e + i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    if (q8) {
        const int lane = tid & 31;
        for (int b = tid >> 5; b < e / 32; b += FC_NORM_THREADS / 32) {
            const int i = 32 * b + lane;
            quantize_warp_q8(__fmul_rn(__fmul_rn(xr[i], scale), w[i]), xq + (unsigned long long)t * (e / 32) + b);
        }
    }
}

// xq[t] = x[t] quantized in blocks of 32 (cols % 32 == 0); one CTA per row.
extern "C" __global__ void quantize_q8(const float* x, int cols, BlockQ8* xq) {
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    for (int b = threadIdx.x >> 5; b < cols / 32; b += blockDim.x >> 5)
        quantize_warp_q8(x[(unsigned long long)t * cols + 32 * b + lane], xq + (unsigned long long)t * (cols / 32) + b);
}
