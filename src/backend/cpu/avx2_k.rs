//! AVX2 kernels of the K-quants Q4_K, Q5_K and Q6_K against Q8_K activations (x86-64). Each
//! block's integer sums are exactly those of `quant::dot_q8k_scalar` and its float formula is
//! the same, in the same block order, so results equal the reference bitwise. Token tiles of 4
//! share each block's unpacked weights (prefill); a token's instruction sequence does not depend
//! on the tile, so its result does not depend on its batch.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::avx2::{f16x1, load32};
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
        GgmlType::Q4K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_k::<Q4K, 4>, dot_k::<Q4K, 1>),
        GgmlType::Q5K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_k::<Q5K, 4>, dot_k::<Q5K, 1>),
        GgmlType::Q6K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot_k::<Q6K, 4>, dot_k::<Q6K, 1>),
        other => unreachable!("avx2_k::matmul_rows_q8k called for {other:?}"),
    }
}

// Everything below is `inline(always)` and only ever inlined into the `#[target_feature]` entry
// point of this file, whose features the backend checked at run time before choosing the level.

/// One K-quant block unpacked: its 256 weights as unsigned bytes in element order (8 vectors of
/// 32; Q6_K's are q + 32), the scale of each group of 16, and the block's f16 factors.
struct KBlock {
    /// [8] × 32 weights as unsigned bytes, in element order (Q6_K's offset by 32)
    pub q: [__m256i; 8],
    /// [16] integer scale of each group of 16 weights (Q4_K / Q5_K: its sub-block's scale, twice)
    pub sc16: [i32; 16],
    /// Q4_K / Q5_K: the min of each sub-block of 32
    pub mins: [i32; 8],
    /// the block's f16 scale factor `d`, as f32
    pub d: f32,
    /// Q4_K / Q5_K: the block's f16 min factor `dmin`, as f32 (0 for Q6_K)
    pub dmin: f32,
}

/// A K-quant format: its block size, how a block unpacks, and the reference's float formula for
/// a block given the integer Σ sc16 · Σ q·x over its groups of 16.
trait KQuant {
    const BB: usize;
    fn unpack(wb: &[u8]) -> KBlock;
    fn finish(b: &KBlock, xb: &BlockQ8K, sum_qx: i32) -> f32;
}

struct Q4K;
struct Q5K;
struct Q6K;

/// Q4_K / Q5_K (with `qh`): nibbles (plus fifth bits) and the 6-bit scales and mins.
#[inline(always)]
fn unpack_q45k(wb: &[u8], qs: &[u8], qh: Option<&[u8]>) -> KBlock {
    // SAFETY: AVX2 enabled in every caller; loads stay inside the block.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let qh = qh.map(load32);
        let mut q = [_mm256_setzero_si256(); 8];
        for pair in 0..4 {
            let v = load32(&qs[32 * pair..]);
            q[2 * pair] = _mm256_and_si256(v, mask);
            q[2 * pair + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            if let Some(qh) = qh {
                // bit j of qh[l] is the fifth bit of sub-block j's element l
                for (k, j) in [(0, 2 * pair), (1, 2 * pair + 1)] {
                    let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), one);
                    q[2 * pair + k] = _mm256_or_si256(q[2 * pair + k], _mm256_slli_epi16(bit, 4));
                }
            }
        }
        let (mut sc16, mut mins) = ([0i32; 16], [0i32; 8]);
        for j in 0..8 {
            let (s, m) = q4k_scale_min(j, &wb[4..16]);
            (sc16[2 * j], sc16[2 * j + 1], mins[j]) = (s as i32, s as i32, m as i32);
        }
        KBlock { q, sc16, mins, d: f16x1(&wb[..2]), dmin: f16x1(&wb[2..4]) }
    }
}

/// d·Σ sc·Σ q·x - dmin·Σ m·bsum (`quant::dot_q8k_scalar`'s Q4_K, `quant_k::dot_q5k_block`).
#[inline(always)]
fn finish_q45k(b: &KBlock, xb: &BlockQ8K, sum_qx: i32) -> f32 {
    let mut sum_min = 0i32;
    for j in 0..8 {
        sum_min += b.mins[j] * (xb.bsums[2 * j] as i32 + xb.bsums[2 * j + 1] as i32);
    }
    let (d, dmin) = (b.d * xb.d, b.dmin * xb.d);
    d * sum_qx as f32 - dmin * sum_min as f32
}

impl KQuant for Q4K {
    const BB: usize = 144;
    #[inline(always)]
    fn unpack(wb: &[u8]) -> KBlock {
        unpack_q45k(wb, &wb[16..144], None)
    }
    #[inline(always)]
    fn finish(b: &KBlock, xb: &BlockQ8K, sum_qx: i32) -> f32 {
        finish_q45k(b, xb, sum_qx)
    }
}

impl KQuant for Q5K {
    const BB: usize = 176;
    #[inline(always)]
    fn unpack(wb: &[u8]) -> KBlock {
        unpack_q45k(wb, &wb[48..176], Some(&wb[16..48]))
    }
    #[inline(always)]
    fn finish(b: &KBlock, xb: &BlockQ8K, sum_qx: i32) -> f32 {
        finish_q45k(b, xb, sum_qx)
    }
}

impl KQuant for Q6K {
    const BB: usize = 210;
    /// The 8 groups of 32 unsigned 6-bit weights (q + 32) and the 16 i8 scales.
    #[inline(always)]
    fn unpack(wb: &[u8]) -> KBlock {
        // SAFETY: AVX2 enabled in every caller; loads stay inside the 210-byte block.
        unsafe {
            let m4 = _mm256_set1_epi8(0x0F);
            let m2 = _mm256_set1_epi8(3);
            let mut q = [_mm256_setzero_si256(); 8];
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
            }
            let sc16 = std::array::from_fn(|g| (wb[192 + g] as i8) as i32);
            KBlock { q, sc16, mins: [0; 8], d: f16x1(&wb[208..]), dmin: 0.0 }
        }
    }
    /// d·(Σ sc·Σ q·x - 32·Σ sc·bsum): Σ (q - 32)·x per group of 16, as the reference's integers.
    #[inline(always)]
    fn finish(b: &KBlock, xb: &BlockQ8K, sum_qx: i32) -> f32 {
        let mut sum_bs = 0i32;
        for (g, &bs) in xb.bsums.iter().enumerate() {
            sum_bs += b.sc16[g] * bs as i32;
        }
        b.d * xb.d * (sum_qx - 32 * sum_bs) as f32
    }
}

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

/// Per-block operands of the AVX2 sum: each group of 32's scales as lanes ([sc16[2g] ×4,
/// sc16[2g + 1] ×4], matching the 8 lanes of 4 values `madd` leaves).
#[inline(always)]
fn scales_avx2(b: &KBlock) -> [__m256i; 8] {
    // SAFETY: AVX2 enabled in every caller.
    std::array::from_fn(|g| unsafe {
        let (lo, hi) = (b.sc16[2 * g], b.sc16[2 * g + 1]);
        _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi)
    })
}

/// Σ sc16 · Σ q·x over the block's groups of 16, with AVX2: per group of 32, `maddubs` then
/// `madd` into 8 lanes of 4 values, times the scales, summed.
#[inline(always)]
fn sum_qx(b: &KBlock, sc: &[__m256i; 8], x: &[i8]) -> i32 {
    // SAFETY: AVX2 enabled in every caller; |u8 · i8| pair sums fit i16 (at most 63 · 127 · 2).
    unsafe {
        let mut s = _mm256_setzero_si256();
        for (g, qg) in b.q.iter().enumerate() {
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*qg, i8x32(&x[32 * g..])), _mm256_set1_epi16(1));
            s = _mm256_add_epi32(s, _mm256_mullo_epi32(p, sc[g]));
        }
        hsum_i32(s)
    }
}

/// One row of format `K` against `NT` token rows: each block unpacked once, then per token the
/// reference's integer sums and float formula.
#[inline(always)]
fn dot_k<K: KQuant, const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    dot_k_with::<K, _, NT>(w, x, out, scales_avx2, sum_qx)
}

/// [`dot_k`] with a per-token integer sum `sum` over the operands `prep` derives once per block.
#[inline(always)]
fn dot_k_with<K: KQuant, P, const NT: usize>(
    w: &[u8],
    x: [&[BlockQ8K]; NT],
    out: &mut [f32; NT],
    prep: impl Fn(&KBlock) -> P,
    sum: impl Fn(&KBlock, &P, &[i8]) -> i32,
) {
    let nb = w.len() / K::BB;
    let x = x.map(|xt| &xt[..nb]);
    let mut acc = [0f32; NT];
    for ib in 0..nb {
        prefetch(w, ib * K::BB);
        let b = K::unpack(&w[ib * K::BB..(ib + 1) * K::BB]);
        let p = prep(&b);
        for t in 0..NT {
            let xb = &x[t][ib];
            acc[t] += K::finish(&b, xb, sum(&b, &p, &xb.qs));
        }
    }
    *out = acc;
}
