// Elementwise kernels: SiLU·mul (with the q8 activations of the down projection), residual add
// and the KV prefix copy.
#pragma once
#include "common.h"

// silu(g) * u with the CPU's arithmetic: g / (1 + exp(-g)) * u.
FC_DEV float silu_mul1(float g, float u) { return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u); }

// The most slices of 256 elements per CTA of silu_mul_q8 (their loads issued together).
#define FC_SILU_SPC 4

// gu: [n, 2*ff] rows (gate | up). act[t] = silu(gate) * up (act may be null: only the q8 blocks
// are wanted); with q8 also actq (ff % 32 == 0). Grid (n, ceil(ff / (256 * spc))), 256 threads,
// spc <= FC_SILU_SPC: spc elements per thread, 256 apart, one q8 block per warp and slice (spc = 1
// for decode: more CTAs, shorter threads). Every element is computed alone, so the grid never
// changes a bit.
extern "C" __global__ void silu_mul_q8(const float* gu, int ff, float* act, BlockQ8* actq, int q8, int spc) {
    const int t = blockIdx.x, i0 = blockIdx.y * spc * blockDim.x + threadIdx.x;
    const float* g = gu + (unsigned long long)t * 2 * ff;
    float gv[FC_SILU_SPC], uv[FC_SILU_SPC];
#pragma unroll
    for (int k = 0; k < FC_SILU_SPC; ++k) {
        const int i = i0 + k * blockDim.x;
        gv[k] = k < spc && i < ff ? g[i] : 0.0f;
        uv[k] = k < spc && i < ff ? g[ff + i] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < FC_SILU_SPC; ++k) {
        if (k >= spc) break;
        const int i = i0 + k * blockDim.x;
        const float v = i < ff ? silu_mul1(gv[k], uv[k]) : 0.0f;
        if (act && i < ff) act[(unsigned long long)t * ff + i] = v;
        if (q8 && i - (int)(threadIdx.x & 31) < ff) quantize_warp_q8(v, actq + (unsigned long long)t * (ff / 32) + i / 32);
    }
}

// g[i] = silu(g[i]) * u[i] for i < n.
extern "C" __global__ void silu_mul(float* g, const float* u, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu_mul1(g[i], u[i]);
}

// x[i] += y[i] for i < n.
extern "C" __global__ void add(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// Positions 0..n of every (layer, head) run of a cache: dst [lh, cap_dst, hd] <- src [lh, cap_src, hd]
// (u16 elements). Grid (ceil(n*hd / 256), lh).
extern "C" __global__ void kv_copy(uint16_t* dst, const uint16_t* src, int cap_dst, int cap_src, int n, int hd) {
    const unsigned long long lh = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * hd) dst[lh * cap_dst * hd + i] = src[lh * cap_src * hd + i];
}
