//! The 8-bit activation block formats every quantized dot product consumes: [`BlockQ8`] for the
//! 32-element block types, [`BlockQ8K`] for K-quants. Plain data at the bottom of the CPU backend,
//! so the scalar references (`quant`, `quant_k`) and the SIMD kernels all depend on it and on
//! nothing above.

use crate::gguf::{QK, QK_K};

/// 32 activations: x ≈ d * qs; `s = d * sum(qs)` (used by Q4_1's offset term).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8 {
    /// scale: x ≈ d · qs
    pub d: f32,
    /// d · Σ qs (Q4_1's and Q5_1's offset term)
    pub s: f32,
    /// [32] quantized values
    pub qs: [i8; QK],
}

/// 256 activations with per-16 sums (K-quants' mins / offsets).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ8K {
    /// scale: x ≈ d · qs
    pub d: f32,
    /// [256] quantized values
    pub qs: [i8; QK_K],
    /// [16] Σ qs over each run of 16 values (the K-quants' min / offset terms)
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        BlockQ8 { d: 0.0, s: 0.0, qs: [0; QK] }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] }
    }
}

/// 32 activations for the repacked kernels (`x16`, `x16q`): `BlockQ8`'s `qs`, `d` and `s` (same
/// quantizer) and Q5_0's offset term as an integer (weights are u - 16: Σ(u - 16)·x = Σu·x + off;
/// Q4_0's u - 8 take `off / 2`, Q8_0's w + 128 take `8 · off`).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct BlockQ8O {
    /// [32] quantized values
    pub qs: [i8; QK],
    /// scale: x ≈ d · qs
    pub d: f32,
    /// -16 · Σ qs
    pub off: i32,
    /// d · Σ qs rounded as `BlockQ8::s` (Q4_1's min term m·s)
    pub s: f32,
}
