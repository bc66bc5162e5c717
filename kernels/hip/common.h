// The portability header every kernels/hip/*.hip file includes: on AMD (hipcc) HIP's runtime
// header, on NVIDIA (nvcc -x cu) CUDA's, plus the few device names our kernels use spelled once:
// warp shuffles over 32 lanes, the 4-way int8 dot product, f16/bf16 conversions, unaligned loads.
//
// A "warp" here is always 32 lanes: on wave64 AMD GPUs (gfx9) a shuffle of width 32 stays inside
// each half of the wavefront, so the same code is right on wave32, wave64 and NVIDIA.
//
// Batch invariance: a kernel that has several instantiations for the same data (matmul's tile
// sizes) writes its float arithmetic with explicit rounding intrinsics (__fmul_rn, __fadd_rn,
// __fmaf_rn) so that no compiler contraction can differ between them.
#pragma once

#include <stdint.h>
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define FC_SHFL_XOR(v, m) __shfl_xor((v), (m), 32)
#define FC_SHFL(v, l) __shfl((v), (l), 32)
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define FC_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define FC_SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#endif

#define FC_DEV __device__ __forceinline__

// 32 activations quantized as GGML's q8 (the CPU's `backend::cpu::quant::BlockQ8`, same bytes):
// x ~ d * qs, s = d * sum(qs); d and s rounded to f16 and kept as f32.
struct BlockQ8 {
    float d;
    float s;
    int8_t qs[32];
};

// One token's position and its sequence's caches, for RoPE, the KV store and attention.
// k, v: [segment layers, n_kv_head, cap, head_dim] f16.
struct TokInfo {
    unsigned long long k;
    unsigned long long v;
    uint32_t cap;
    uint32_t pos;
};

FC_DEV int lane_id() { return (threadIdx.x + threadIdx.y * blockDim.x) & 31; }
FC_DEV int thread_id() { return threadIdx.x + threadIdx.y * blockDim.x; }

FC_DEV float f16_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
FC_DEV uint16_t f32_to_f16(float v) { return __half_as_ushort(__float2half_rn(v)); }
FC_DEV float round_f16(float v) { return __half2float(__float2half_rn(v)); }
FC_DEV float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Little-endian loads from 2-byte aligned addresses (GGUF blocks are 18, 20, 34, 210 bytes).
FC_DEV uint16_t ld_u16(const uint8_t* p) { return *(const uint16_t*)p; }
FC_DEV float ld_f16(const uint8_t* p) { return f16_to_f32(ld_u16(p)); }
FC_DEV int ld_i32_a2(const uint8_t* p) {
    const uint16_t* q = (const uint16_t*)p;
    return (int)((uint32_t)q[0] | ((uint32_t)q[1] << 16));
}
// 4 / 8 int8 activations (BlockQ8::qs is 8-byte aligned: 40-byte blocks, qs at byte 8).
FC_DEV int ld_x4(const int8_t* p) { return *(const int*)p; }
FC_DEV int2 ld_x8(const int8_t* p) { return *(const int2*)p; }

// c + sum of the four int8 products of a and b: the targets below have dot1-insts
// (v_dot4_i32_i8); every other one takes the portable sum (same integer result). Not gfx1013:
// HIP 5.2's clang refuses the builtin there ("needs target feature dot1-insts").
FC_DEV int dot4(int a, int b, int c) {
#if defined(__CUDA_ARCH__)
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx1011__) || defined(__gfx1012__) || defined(__gfx1030__) || \
    defined(__gfx1031__) || defined(__gfx1032__) || defined(__gfx1033__) || defined(__gfx1034__) || \
    defined(__gfx1035__) || defined(__gfx1036__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#else
    const int8_t* pa = (const int8_t*)&a;
    const int8_t* pb = (const int8_t*)&b;
    return c + pa[0] * pb[0] + pa[1] * pb[1] + pa[2] * pb[2] + pa[3] * pb[3];
#endif
}

// Butterfly reductions over the 32 lanes of a warp: every lane gets the same bits.
FC_DEV float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = __fadd_rn(v, FC_SHFL_XOR(v, m));
    return v;
}
FC_DEV int warp_sum_i(int v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += FC_SHFL_XOR(v, m);
    return v;
}
FC_DEV float warp_max(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, FC_SHFL_XOR(v, m));
    return v;
}

// Sum over a block of `nwarps` warps (all threads call it; every thread gets the result):
// warp butterflies, then warp 0's partials added in warp order. `scratch`: nwarps floats.
FC_DEV float block_sum(float v, float* scratch, int nwarps) {
    v = warp_sum(v);
    const int tid = thread_id();
    __syncthreads();
    if ((tid & 31) == 0) scratch[tid >> 5] = v;
    __syncthreads();
    float s = scratch[0];
    for (int w = 1; w < nwarps; ++w) s = __fadd_rn(s, scratch[w]);
    return s;
}
FC_DEV float block_max(float v, float* scratch, int nwarps) {
    v = warp_max(v);
    const int tid = thread_id();
    __syncthreads();
    if ((tid & 31) == 0) scratch[tid >> 5] = v;
    __syncthreads();
    float s = scratch[0];
    for (int w = 1; w < nwarps; ++w) s = fmaxf(s, scratch[w]);
    return s;
}

// Quantizes 32 values, lane j holding value j, into `out` as the CPU's quantize_block_q8 does
// (scale 127/amax, round half to even, d and s rounded to f16): the same bits for the same input.
FC_DEV void quantize_warp_q8(float v, BlockQ8* out) {
    const int lane = lane_id();
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rintf(__fmul_rn(v, id));
    const int sum = warp_sum_i(q);
    out->qs[lane] = (int8_t)q;
    if (lane == 0) {
        out->d = round_f16(d);
        out->s = round_f16(__fmul_rn(d, (float)sum));
    }
}
