//! Scalar reference dot products of the K-quant blocks added beside Q4_K / Q6_K (whose
//! references live in `quant::dot_q8k_scalar`): Q2_K, Q3_K and Q5_K against a Q8_K activation
//! block. Integer sums are exact; the float formula per block is GGML's
//! (`ggml_vec_dot_q*_K_q8_K_generic`), and the SIMD kernels repeat it, so they match bitwise.

use super::blocks::BlockQ8K;
use crate::gguf::types::kquant::q3k_scales;
use crate::gguf::types::{f16_at, q4k_scale_min};

/// Q2_K: d·Σ sc·Σq·x - dmin·Σ m·bsum, per 16 values (q 0..4).
pub fn dot_q2k_block(w: &[u8], x: &BlockQ8K) -> f32 {
    let (scales, qs) = (&w[0..16], &w[16..80]);
    let (d, dmin) = (f16_at(w, 80) * x.d, f16_at(w, 82) * x.d);
    let summs: i32 = (0..16).map(|g| x.bsums[g] as i32 * (scales[g] >> 4) as i32).sum();
    let mut isum = 0i32;
    for n in 0..2 {
        for j in 0..4 {
            for half in 0..2 {
                let g = 8 * n + 2 * j + half;
                let mut s = 0i32;
                for l in 16 * half..16 * half + 16 {
                    s += ((qs[32 * n + l] >> (2 * j)) & 3) as i32 * x.qs[128 * n + 32 * j + l] as i32;
                }
                isum += (scales[g] & 0x0F) as i32 * s;
            }
        }
    }
    d * isum as f32 - dmin * summs as f32
}

/// Q3_K: d·Σ (sc - 32)·Σ q·x per 16 values (q -4..4).
pub fn dot_q3k_block(w: &[u8], x: &BlockQ8K) -> f32 {
    let (hmask, qs) = (&w[0..32], &w[32..96]);
    let scales = q3k_scales(&w[96..108]);
    let d = f16_at(w, 108) * x.d;
    let mut isum = 0i32;
    for n in 0..2 {
        for j in 0..4 {
            for half in 0..2 {
                let mut s = 0i32;
                for l in 16 * half..16 * half + 16 {
                    let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i32;
                    let q = low - if (hmask[l] >> (4 * n + j)) & 1 == 1 { 0 } else { 4 };
                    s += q * x.qs[128 * n + 32 * j + l] as i32;
                }
                isum += scales[8 * n + 2 * j + half] as i32 * s;
            }
        }
    }
    d * isum as f32
}

/// Q5_K: d·Σ sc·Σ q·x - dmin·Σ m·bsum, per 32 values (q 0..32).
pub fn dot_q5k_block(w: &[u8], x: &BlockQ8K) -> f32 {
    let (d, dmin) = (f16_at(w, 0) * x.d, f16_at(w, 2) * x.d);
    let (scales, qh, qs) = (&w[4..16], &w[16..48], &w[48..176]);
    let (mut sum_sc, mut sum_min) = (0i32, 0i32);
    for j in 0..8 {
        let (pair, high) = (j / 2, j % 2);
        let (sc, m) = q4k_scale_min(j, scales);
        let mut s = 0i32;
        for l in 0..32 {
            let q = qs[32 * pair + l];
            let nib = if high == 0 { q & 0x0F } else { q >> 4 };
            let v = nib | (((qh[l] >> j) & 1) << 4);
            s += v as i32 * x.qs[32 * j + l] as i32;
        }
        sum_sc += sc as i32 * s;
        sum_min += m as i32 * (x.bsums[2 * j] as i32 + x.bsums[2 * j + 1] as i32);
    }
    d * sum_sc as f32 - dmin * sum_min as f32
}
