//! AVX2 kernels of the K-quants Q4_K, Q5_K and Q6_K against Q8_K activations (x86-64). Each
//! block's integer sums are exactly those of `quant::dot_q8k_scalar` and its float formula is
//! the same, in the same block order, so results equal the reference bitwise. Token tiles of 4
//! share each block's unpacked weights (prefill); a token's instruction sequence does not depend
//! on the tile, so its result does not depend on its batch.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::avx2::{blocks, f16x1, load32};
use super::quant::BlockQ8K;
use super::shared::{prefetch, tile_rows_with, SharedOut};
use crate::backend::WeightView;
use crate::gguf::types::q4k_scale_min;
use crate::gguf::{GgmlType, QK_K};

/// The K-quant types with a kernel here.
pub const Q8K_TYPES: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

/// Rows `rows` of a Q4_K / Q5_K / Q6_K matrix against `n_tok` Q8_K activation rows (`acts`:
/// [n_tok, cols / 256]), in token tiles of 4 (then single tokens).
#[target_feature(enable = "avx2,fma,f16c")]
pub fn matmul_rows_q8k(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
    let nb = w.cols / QK_K;
    match w.ty {
        GgmlType::Q4K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_q45k::<false, 4>, dot_q45k::<false, 1>),
        GgmlType::Q5K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_q45k::<true, 4>, dot_q45k::<true, 1>),
        GgmlType::Q6K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_q6k::<4>, dot_q6k::<1>),
        other => unreachable!("avx2_k::matmul_rows_q8k called for {other:?}"),
    }
}

// Everything below is `inline(always)` and only ever inlined into `matmul_rows_q8k`, whose
// features the backend checked at run time before choosing this level.

/// Sum of 8 i32 lanes.
#[inline(always)]
fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: AVX2 enabled in every caller.
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    }
}

#[inline(always)]
fn i8x32(x: &[i8]) -> __m256i {
    assert!(x.len() >= 32);
    // SAFETY: 32 readable bytes (asserted); unaligned load.
    unsafe { _mm256_loadu_si256(x.as_ptr() as *const __m256i) }
}

/// 32 u8 weights times 32 i8 activations, summed in groups of 4 into 8 i32 lanes.
#[inline(always)]
fn dot32(q: __m256i, x: &[i8]) -> __m256i {
    // SAFETY: AVX2 enabled in every caller; |u8 · i8| pair sums fit i16 (at most 63 · 128 · 2).
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(q, i8x32(x)), _mm256_set1_epi16(1)) }
}

/// Q4_K (`FIFTH` false) and Q5_K (`FIFTH` true): per block the 8 sub-blocks' u8 weights, then
/// per token Σ sc·Σ q·x and Σ m·bsum as in the reference.
#[inline(always)]
fn dot_q45k<const FIFTH: bool, const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    const Q4: usize = 144;
    const Q5: usize = 176;
    if FIFTH {
        dot_q45k_blocks::<Q5, true, NT>(w, x, out)
    } else {
        dot_q45k_blocks::<Q4, false, NT>(w, x, out)
    }
}

#[inline(always)]
fn dot_q45k_blocks<const BB: usize, const FIFTH: bool, const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    let (blocks, x) = blocks::<BlockQ8K, BB, NT>(w, x);
    let mut acc = [0f32; NT];
    // SAFETY (whole body): AVX2 enabled in every caller; loads stay inside the block.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        for (ib, wb) in blocks.iter().enumerate() {
            prefetch(w, ib * BB);
            let (dw, dminw) = (f16x1(&wb[..2]), f16x1(&wb[2..4]));
            let scales = &wb[4..16];
            let qs = if FIFTH { &wb[48..176] } else { &wb[16..144] };
            let qh = if FIFTH { load32(&wb[16..48]) } else { _mm256_setzero_si256() };
            let mut q = [_mm256_setzero_si256(); 8];
            let mut sc = [0i32; 8];
            let mut mins = [0i32; 8];
            for pair in 0..4 {
                let v = load32(&qs[32 * pair..]);
                q[2 * pair] = _mm256_and_si256(v, mask);
                q[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
                if FIFTH {
                    // bit j of qh[l] is the fifth bit of sub-block j's element l
                    let one = _mm256_set1_epi8(1);
                    let b0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * pair as i32)), one);
                    let b1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * pair as i32 + 1)), one);
                    q[2 * pair] = _mm256_or_si256(q[2 * pair], _mm256_slli_epi16(b0, 4));
                    q[2 * pair + 1] = _mm256_or_si256(q[2 * pair + 1], _mm256_slli_epi16(b1, 4));
                }
            }
            for j in 0..8 {
                let (s, m) = q4k_scale_min(j, scales);
                (sc[j], mins[j]) = (s as i32, m as i32);
            }
            for t in 0..NT {
                let xb = &x[t][ib];
                let mut s = _mm256_setzero_si256();
                for (j, qj) in q.iter().enumerate() {
                    s = _mm256_add_epi32(s, _mm256_mullo_epi32(dot32(*qj, &xb.qs[32 * j..]), _mm256_set1_epi32(sc[j])));
                }
                let sum_sc = hsum_i32(s);
                let mut sum_min = 0i32;
                for j in 0..8 {
                    sum_min += mins[j] * (xb.bsums[2 * j] as i32 + xb.bsums[2 * j + 1] as i32);
                }
                let (d, dmin) = (dw * xb.d, dminw * xb.d);
                acc[t] += d * sum_sc as f32 - dmin * sum_min as f32;
            }
        }
    }
    *out = acc;
}

/// Q6_K: per block the 8 groups of 32 unsigned 6-bit weights (q + 32) and the 16 scales, then per
/// token Σ sc·(Σ q·x - 32·bsum) per 16 values as in the reference.
#[inline(always)]
fn dot_q6k<const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    let (blocks, x) = blocks::<BlockQ8K, 210, NT>(w, x);
    let mut acc = [0f32; NT];
    // SAFETY (whole body): AVX2 enabled in every caller; loads stay inside the 210-byte block.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        for (ib, wb) in blocks.iter().enumerate() {
            prefetch(w, ib * 210);
            let dw = f16x1(&wb[208..]);
            let sc = &wb[192..208];
            let mut q = [_mm256_setzero_si256(); 8];
            let mut scale = [_mm256_setzero_si256(); 8];
            for half in 0..2 {
                let ql0 = load32(&wb[64 * half..]);
                let ql1 = load32(&wb[64 * half + 32..]);
                let qh = load32(&wb[128 + 32 * half..]);
                let hi = |shift: i32| _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), m2), 4);
                let g = 4 * half;
                q[g] = _mm256_or_si256(_mm256_and_si256(ql0, m4), hi(0));
                q[g + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), hi(2));
                q[g + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hi(4));
                q[g + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hi(6));
                for k in 0..4 {
                    // lanes 0..4 hold elements 0..16 of the group (scale 2k), lanes 4..8 the rest
                    let (lo, hi) = ((sc[8 * half + 2 * k] as i8) as i32, (sc[8 * half + 2 * k + 1] as i8) as i32);
                    scale[g + k] = _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi);
                }
            }
            for t in 0..NT {
                let xb = &x[t][ib];
                // Σ (q - 32)·x = Σ q·x - 32·Σ x per group of 16 (q in 0..64 is unsigned for maddubs).
                let mut s = _mm256_setzero_si256();
                for (g, (qg, sg)) in q.iter().zip(&scale).enumerate() {
                    s = _mm256_add_epi32(s, _mm256_mullo_epi32(dot32(*qg, &xb.qs[32 * g..]), *sg));
                }
                let sum_qx = hsum_i32(s);
                let mut sum_bs = 0i32;
                for (g, &b) in xb.bsums.iter().enumerate() {
                    sum_bs += (sc[g] as i8) as i32 * b as i32;
                }
                acc[t] += dw * xb.d * (sum_qx - 32 * sum_bs) as f32;
            }
        }
    }
    *out = acc;
}
