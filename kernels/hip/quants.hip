// Weight types: one struct per GGML type, all a matmul or an embedding lookup needs to know.
//
//   Act    activations it multiplies: BlockQ8 (32 int8 + scale, as the CPU's q8) or float
//   QB, BB values and bytes per block (GGUF layout, read as it is stored: no repacking)
//   NI     work items per block: a row of `nb` blocks is nb * NI items, dealt to the lanes
//   XB     activation units per block (BlockQ8s, or floats for the float types)
//   Item   one item's weights, unpacked once and reused for every token of a tile
//   load   block + item index -> Item;  dot: Item . activations -> float (explicit rounding)
//   value  element i of a block, dequantized with the CPU reference's arithmetic (bitwise)
//   qblock, qpart, combine (Q4_0, Q4_1, Q8_0 only): a whole block (or its words k, 4 + k) as 8 words of 4 int8 (element order,
//          like BlockQ8::qs) with its scale (and min), and the one float step that adds the
//          block's exact integer dot product to a running sum; matmul.hip's "q8 order" (the one
//          order of its one-token, tile and tensor-core kernels for these types) is built on them
//
// Adding a type is one more struct here plus its line in matmul.hip's kernel list and in the list below.
#pragma once
#include "common.h"

// d * q - 8 for 4 nibbles at once: (q + 0x78) ^ 0x80 is q - 8 as int8, no carries across bytes.
FC_DEV int nib_lo_m8(uint32_t w) { return (int)(((w & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u); }
FC_DEV int nib_hi_m8(uint32_t w) { return (int)((((w >> 4) & 0x0F0F0F0Fu) + 0x78787878u) ^ 0x80808080u); }

struct WQ4_0 {
    typedef BlockQ8 Act;
    static constexpr int QB = 32, BB = 18, NI = 2, XB = 1;
    struct Item { int lo0, lo1, hi0, hi1; float d; };
    // item k: bytes 8k..8k+8 of qs = elements 8k..8k+8 (low nibbles) and 16+8k.. (high nibbles)
    FC_DEV static Item load(const uint8_t* b, int k) {
        const uint32_t w0 = (uint32_t)ld_i32_a2(b + 2 + 8 * k), w1 = (uint32_t)ld_i32_a2(b + 6 + 8 * k);
        Item it;
        it.lo0 = nib_lo_m8(w0); it.lo1 = nib_lo_m8(w1); it.hi0 = nib_hi_m8(w0); it.hi1 = nib_hi_m8(w1);
        it.d = ld_f16(b);
        return it;
    }
    FC_DEV static float dot(const Item& it, int k, const BlockQ8* x) {
        const int2 a = ld_x8(x->qs + 8 * k), c = ld_x8(x->qs + 16 + 8 * k);
        const int s = dot4(it.hi1, c.y, dot4(it.hi0, c.x, dot4(it.lo1, a.y, dot4(it.lo0, a.x, 0))));
        return __fmul_rn(__fmul_rn(it.d, x->d), (float)s);
    }
    FC_DEV static float value(const uint8_t* b, int i) {
        const uint8_t q = b[2 + (i & 15)];
        const int v = (i < 16 ? (q & 15) : (q >> 4)) - 8;
        return __fmul_rn((float)v, ld_f16(b));
    }
    // Whole-block form (matmul.hip's q8 order): q[j] = elements 4j..4j+3 as int8, like BlockQ8::qs.
    FC_DEV static void qblock(const uint8_t* b, int* q, float* d, float* m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t w = (uint32_t)ld_i32_a2(b + 2 + 4 * j);
            q[j] = nib_lo_m8(w);
            q[4 + j] = nib_hi_m8(w);
        }
        *d = ld_f16(b);
        *m = 0.0f;
    }
    // Words k and 4 + k (k < 4) of qblock's q: a quarter of the block, for 4 lanes per block.
    FC_DEV static void qpart(const uint8_t* b, int k, int* lo, int* hi, float* d, float* m) {
        const uint32_t w = (uint32_t)ld_i32_a2(b + 2 + 4 * k);
        *lo = nib_lo_m8(w);
        *hi = nib_hi_m8(w);
        *d = ld_f16(b);
        *m = 0.0f;
    }
    // acc + (d * x.d) * isum, one rounding step (isum: the block's exact integer dot product, as float).
    FC_DEV static float combine(float acc, float d, float, float xd, float, float isum) {
        return __fmaf_rn(__fmul_rn(d, xd), isum, acc);
    }
};

struct WQ4_1 {
    typedef BlockQ8 Act;
    static constexpr int QB = 32, BB = 20, NI = 2, XB = 1;
    struct Item { int lo0, lo1, hi0, hi1; float d, m; };
    FC_DEV static Item load(const uint8_t* b, int k) {
        const uint32_t w0 = (uint32_t)ld_i32_a2(b + 4 + 8 * k), w1 = (uint32_t)ld_i32_a2(b + 8 + 8 * k);
        Item it;
        it.lo0 = (int)(w0 & 0x0F0F0F0Fu); it.lo1 = (int)(w1 & 0x0F0F0F0Fu);
        it.hi0 = (int)((w0 >> 4) & 0x0F0F0F0Fu); it.hi1 = (int)((w1 >> 4) & 0x0F0F0F0Fu);
        it.d = ld_f16(b);
        it.m = k == 0 ? ld_f16(b + 2) : 0.0f;  // the block's offset term, counted once (item 0)
        return it;
    }
    FC_DEV static float dot(const Item& it, int k, const BlockQ8* x) {
        const int2 a = ld_x8(x->qs + 8 * k), c = ld_x8(x->qs + 16 + 8 * k);
        const int s = dot4(it.hi1, c.y, dot4(it.hi0, c.x, dot4(it.lo1, a.y, dot4(it.lo0, a.x, 0))));
        return __fadd_rn(__fmul_rn(__fmul_rn(it.d, x->d), (float)s), __fmul_rn(it.m, x->s));
    }
    FC_DEV static float value(const uint8_t* b, int i) {
        const uint8_t q = b[4 + (i & 15)];
        const int v = i < 16 ? (q & 15) : (q >> 4);
        return __fadd_rn(__fmul_rn((float)v, ld_f16(b)), ld_f16(b + 2));
    }
    FC_DEV static void qblock(const uint8_t* b, int* q, float* d, float* m) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t w = (uint32_t)ld_i32_a2(b + 4 + 4 * j);
            q[j] = (int)(w & 0x0F0F0F0Fu);
            q[4 + j] = (int)((w >> 4) & 0x0F0F0F0Fu);
        }
        *d = ld_f16(b);
        *m = ld_f16(b + 2);
    }
    FC_DEV static void qpart(const uint8_t* b, int k, int* lo, int* hi, float* d, float* m) {
        const uint32_t w = (uint32_t)ld_i32_a2(b + 4 + 4 * k);
        *lo = (int)(w & 0x0F0F0F0Fu);
        *hi = (int)((w >> 4) & 0x0F0F0F0Fu);
        *d = ld_f16(b);
        *m = ld_f16(b + 2);
    }
    // acc + m * x.s, then + (d * x.d) * isum.
    FC_DEV static float combine(float acc, float d, float m, float xd, float xs, float isum) {
        return __fmaf_rn(__fmul_rn(d, xd), isum, __fmaf_rn(m, xs, acc));
    }
};

struct WQ8_0 {
    typedef BlockQ8 Act;
    static constexpr int QB = 32, BB = 34, NI = 2, XB = 1;
    struct Item { int q[4]; float d; };
    FC_DEV static Item load(const uint8_t* b, int k) {
        Item it;
#pragma unroll
        for (int j = 0; j < 4; ++j) it.q[j] = ld_i32_a2(b + 2 + 16 * k + 4 * j);
        it.d = ld_f16(b);
        return it;
    }
    FC_DEV static float dot(const Item& it, int k, const BlockQ8* x) {
        const int2 a = ld_x8(x->qs + 16 * k), c = ld_x8(x->qs + 16 * k + 8);
        const int s = dot4(it.q[3], c.y, dot4(it.q[2], c.x, dot4(it.q[1], a.y, dot4(it.q[0], a.x, 0))));
        return __fmul_rn(__fmul_rn(it.d, x->d), (float)s);
    }
    FC_DEV static float value(const uint8_t* b, int i) { return __fmul_rn((float)(int8_t)b[2 + i], ld_f16(b)); }
    FC_DEV static void qblock(const uint8_t* b, int* q, float* d, float* m) {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = ld_i32_a2(b + 2 + 4 * j);
        *d = ld_f16(b);
        *m = 0.0f;
    }
    FC_DEV static void qpart(const uint8_t* b, int k, int* lo, int* hi, float* d, float* m) {
        *lo = ld_i32_a2(b + 2 + 4 * k);
        *hi = ld_i32_a2(b + 18 + 4 * k);
        *d = ld_f16(b);
        *m = 0.0f;
    }
    FC_DEV static float combine(float acc, float d, float, float xd, float, float isum) {
        return __fmaf_rn(__fmul_rn(d, xd), isum, acc);
    }
};

// Scale and min of sub-block j (0..8) of a Q4_K block (gguf::types::q4k_scale_min).
FC_DEV void q4k_scale_min(int j, const uint8_t* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32. Item p (0..4): qs[32p..32p+32],
// low nibbles = sub-block 2p, high nibbles = sub-block 2p+1 (activation blocks 2p, 2p+1).
struct WQ4_K {
    typedef BlockQ8 Act;
    static constexpr int QB = 256, BB = 144, NI = 4, XB = 8;
    struct Item { int lo[8], hi[8]; float d1, d2, m1, m2; };
    FC_DEV static Item load(const uint8_t* b, int p) {
        Item it;
        const uint8_t* q = b + 16 + 32 * p;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const uint32_t w = (uint32_t)ld_i32_a2(q + 4 * j);
            it.lo[j] = (int)(w & 0x0F0F0F0Fu);
            it.hi[j] = (int)((w >> 4) & 0x0F0F0F0Fu);
        }
        int sc1, m1, sc2, m2;
        q4k_scale_min(2 * p, b + 4, &sc1, &m1);
        q4k_scale_min(2 * p + 1, b + 4, &sc2, &m2);
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        it.d1 = __fmul_rn(d, (float)sc1);
        it.d2 = __fmul_rn(d, (float)sc2);
        it.m1 = __fmul_rn(dmin, (float)m1);
        it.m2 = __fmul_rn(dmin, (float)m2);
        return it;
    }
    FC_DEV static float dot(const Item& it, int p, const BlockQ8* x) {
        const BlockQ8* x1 = x + 2 * p;
        const BlockQ8* x2 = x1 + 1;
        int s1 = 0, s2 = 0, n1 = 0, n2 = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int a = ld_x4(x1->qs + 4 * j), c = ld_x4(x2->qs + 4 * j);
            s1 = dot4(it.lo[j], a, s1);
            s2 = dot4(it.hi[j], c, s2);
            n1 = dot4(0x01010101, a, n1);
            n2 = dot4(0x01010101, c, n2);
        }
        const float v1 = __fsub_rn(__fmul_rn(it.d1, (float)s1), __fmul_rn(it.m1, (float)n1));
        const float v2 = __fsub_rn(__fmul_rn(it.d2, (float)s2), __fmul_rn(it.m2, (float)n2));
        return __fadd_rn(__fmul_rn(v1, x1->d), __fmul_rn(v2, x2->d));
    }
    FC_DEV static float value(const uint8_t* b, int i) {
        const int j = i / 32, l = i % 32;
        const uint8_t q = b[16 + 32 * (j / 2) + l];
        int sc, m;
        q4k_scale_min(j, b + 4, &sc, &m);
        const float dj = __fmul_rn(ld_f16(b), (float)sc), mj = __fmul_rn(ld_f16(b + 2), (float)m);
        return __fsub_rn(__fmul_rn(dj, (float)((j & 1) ? (q >> 4) : (q & 15))), mj);
    }
};

// (lo | hi << 4) - 32 for 4 6-bit values at once (no carries: lo | hi <= 63).
FC_DEV int q6_m32(uint32_t lo, uint32_t hi) { return (int)(((lo | (hi << 4)) + 0x60606060u) ^ 0x80808080u); }

// Q6_K: ql[128], qh[64], scales[16] (int8), d (f16 at 208). Item h*4 + k (h: half, k: 0..4):
// l = 8k..8k+8 of that half, i.e. 8 values in each of its four groups of 32 (activation blocks
// 4h..4h+4), with scales sc[8h + k/2 + 2g].
struct WQ6_K {
    typedef BlockQ8 Act;
    static constexpr int QB = 256, BB = 210, NI = 8, XB = 8;
    struct Item { int q[4][2]; float s[4]; };
    FC_DEV static Item load(const uint8_t* b, int item) {
        const int h = item >> 2, l0 = 8 * (item & 3);
        const uint8_t* ql = b + 64 * h + l0;
        const uint8_t* qh = b + 128 + 32 * h + l0;
        const float d = ld_f16(b + 208);
        Item it;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const uint32_t a = (uint32_t)ld_i32_a2(ql + 4 * j), c = (uint32_t)ld_i32_a2(ql + 32 + 4 * j);
            const uint32_t hb = (uint32_t)ld_i32_a2(qh + 4 * j);
            it.q[0][j] = q6_m32(a & 0x0F0F0F0Fu, hb & 0x03030303u);
            it.q[1][j] = q6_m32(c & 0x0F0F0F0Fu, (hb >> 2) & 0x03030303u);
            it.q[2][j] = q6_m32((a >> 4) & 0x0F0F0F0Fu, (hb >> 4) & 0x03030303u);
            it.q[3][j] = q6_m32((c >> 4) & 0x0F0F0F0Fu, (hb >> 6) & 0x03030303u);
        }
#pragma unroll
        for (int g = 0; g < 4; ++g) it.s[g] = __fmul_rn(d, (float)(int8_t)b[192 + 8 * h + (l0 >> 4) + 2 * g]);
        return it;
    }
    FC_DEV static float dot(const Item& it, int item, const BlockQ8* x) {
        const int h = item >> 2, l0 = 8 * (item & 3);
        float acc = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const BlockQ8* xb = x + 4 * h + g;
            const int s = dot4(it.q[g][1], ld_x4(xb->qs + l0 + 4), dot4(it.q[g][0], ld_x4(xb->qs + l0), 0));
            acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(it.s[g], xb->d), (float)s));
        }
        return acc;
    }
    FC_DEV static float value(const uint8_t* b, int i) {
        const int h = i / 128, r = i % 128, g = r / 32, l = r % 32;
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const int lo = (g & 1) ? ql[l + 32] : ql[l];
        const int q = (((g & 2) ? (lo >> 4) : (lo & 15)) | (((qh[l] >> (2 * g)) & 3) << 4)) - 32;
        const float d = ld_f16(b + 208);
        const int sc = (int8_t)b[192 + 8 * h + l / 16 + 2 * g];
        return __fmul_rn(__fmul_rn(d, (float)sc), (float)q);
    }
};

// Float weights multiply f32 activations; a "block" is 8 values (rows need cols % 8 == 0).
FC_DEV float dot8(const float* w, const float* x) {
    const float4 a = *(const float4*)x, c = *(const float4*)(x + 4);
    float s = __fmul_rn(w[0], a.x);
    s = __fmaf_rn(w[1], a.y, s); s = __fmaf_rn(w[2], a.z, s); s = __fmaf_rn(w[3], a.w, s);
    s = __fmaf_rn(w[4], c.x, s); s = __fmaf_rn(w[5], c.y, s); s = __fmaf_rn(w[6], c.z, s); s = __fmaf_rn(w[7], c.w, s);
    return s;
}

struct WF32 {
    typedef float Act;
    static constexpr int QB = 8, BB = 32, NI = 1, XB = 8;
    struct Item { float w[8]; };
    FC_DEV static Item load(const uint8_t* b, int) {
        const float4 a = *(const float4*)b, c = *(const float4*)(b + 16);
        Item it = {{a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w}};
        return it;
    }
    FC_DEV static float dot(const Item& it, int, const float* x) { return dot8(it.w, x); }
    FC_DEV static float value(const uint8_t* b, int i) { return ((const float*)b)[i]; }
};

// 8 f16 / bf16 values from 16 aligned bytes.
FC_DEV void load_u16x8(const uint8_t* b, uint16_t* h) {
    const uint4 u = *(const uint4*)b;
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        h[2 * j] = (uint16_t)(w[j] & 0xFFFF);
        h[2 * j + 1] = (uint16_t)(w[j] >> 16);
    }
}

struct WF16 {
    typedef float Act;
    static constexpr int QB = 8, BB = 16, NI = 1, XB = 8;
    struct Item { float w[8]; };
    FC_DEV static Item load(const uint8_t* b, int) {
        uint16_t h[8];
        load_u16x8(b, h);
        Item it;
#pragma unroll
        for (int j = 0; j < 8; ++j) it.w[j] = f16_to_f32(h[j]);
        return it;
    }
    FC_DEV static float dot(const Item& it, int, const float* x) { return dot8(it.w, x); }
    FC_DEV static float value(const uint8_t* b, int i) { return ld_f16(b + 2 * i); }
};

struct WBF16 {
    typedef float Act;
    static constexpr int QB = 8, BB = 16, NI = 1, XB = 8;
    struct Item { float w[8]; };
    FC_DEV static Item load(const uint8_t* b, int) {
        uint16_t h[8];
        load_u16x8(b, h);
        Item it;
#pragma unroll
        for (int j = 0; j < 8; ++j) it.w[j] = bf16_to_f32(h[j]);
        return it;
    }
    FC_DEV static float dot(const Item& it, int, const float* x) { return dot8(it.w, x); }
    FC_DEV static float value(const uint8_t* b, int i) { return bf16_to_f32(ld_u16(b + 2 * i)); }
};

// The type list: X(name, struct). matmul.hip and embed.hip instantiate their kernels over it.
#define FC_WEIGHT_TYPES(X) \
    X(f32, WF32)           \
    X(f16, WF16)           \
    X(bf16, WBF16)         \
    X(q4_0, WQ4_0)         \
    X(q4_1, WQ4_1)         \
    X(q8_0, WQ8_0)         \
    X(q4_k, WQ4_K)         \
    X(q6_k, WQ6_K)
