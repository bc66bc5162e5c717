//! AVX-512 VNNI kernels of the K-quants Q4_K, Q5_K and Q6_K against Q8_K activations (x86-64),
//! and this level's Q8_K activation quantizer.
//!
//! A block unpacks at full width into 4 vectors of 64 u8 weights in element order (Q6_K's are
//! q + 32), plus the scale of each weight pair as i16 words. Per token, `vpmaddubsw` multiplies
//! 64 weights by 64 i8 activations into 32 i16 pair sums and `vpdpwssd` multiplies those by
//! their scales and adds them into 16 i32 lanes: two instructions per 64 weights. Every product
//! and sum is an exact integer (a pair sum is at most 2 · 63 · 127, inside i16), and the float
//! formula per block is the reference's, in block order, so results equal
//! `quant::dot_q8k_scalar` bitwise (`cpu::tests`), whatever the token tile.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::avx2::f16x1;
use super::quant::BlockQ8K;
use super::shared::{prefetch, tile_rows_with8, SharedOut};
use crate::backend::WeightView;
use crate::gguf::{GgmlType, QK_K};

/// Rows `rows` of a Q4_K / Q5_K / Q6_K matrix against `n_tok` Q8_K activation rows (`acts`:
/// [n_tok, cols / 256]), in token tiles of 8 (then 4, then single tokens).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn matmul_rows_q8k(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
    let nb = w.cols / QK_K;
    match w.ty {
        GgmlType::Q4K => tile_rows_with8(w, rows, acts, nb, n_tok, out, dot::<Q4K, 8>, dot::<Q4K, 4>, dot::<Q4K, 1>),
        GgmlType::Q5K => tile_rows_with8(w, rows, acts, nb, n_tok, out, dot::<Q5K, 8>, dot::<Q5K, 4>, dot::<Q5K, 1>),
        GgmlType::Q6K => tile_rows_with8(w, rows, acts, nb, n_tok, out, dot::<Q6K, 8>, dot::<Q6K, 4>, dot::<Q6K, 1>),
        other => unreachable!("avx512_k::matmul_rows_q8k called for {other:?}"),
    }
}

/// Quantizes `x` (length a multiple of 256) into `out` (len x.len() / 256) with exactly
/// `quant::quantize_q8k`'s arithmetic: the same `qs`, `bsums` and `d`, bit for bit.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        quantize_block(xs, b);
    }
}

// Everything below is `inline(always)` and only ever inlined into the `#[target_feature]`
// functions above, whose features the backend checked at run time before choosing this level.

#[inline(always)]
fn quantize_block(xs: &[f32], b: &mut BlockQ8K) {
    assert!(xs.len() == QK_K);
    // SAFETY: AVX-512F/BW are enabled in the only caller; every load reads 16 of the 256 floats
    // of `xs` (asserted), every store 16 of the 256 bytes of `b.qs`.
    unsafe {
        let v = |i: usize| _mm512_loadu_ps(xs.as_ptr().add(16 * i));
        let mut m = _mm512_setzero_ps();
        for i in 0..16 {
            // NaN-ignoring as the reference's `>`: max_ps returns its second operand on NaN
            m = _mm512_max_ps(_mm512_abs_ps(v(i)), m);
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            *b = BlockQ8K::default();
            return;
        }
        // The reference keeps the first value of largest magnitude (its sign makes d's).
        let first = (0..16)
            .find_map(|i| {
                let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v(i)), _mm512_set1_ps(amax));
                (hit != 0).then(|| 16 * i + hit.trailing_zeros() as usize)
            })
            .unwrap_or(0);
        let iscale = -127.0 / xs[first];
        let is = _mm512_set1_ps(iscale);
        for i in 0..16 {
            // round half to even (the default MXCSR mode), as `round_ties_even`, then min 127
            let q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(is, v(i))), _mm512_set1_epi32(127));
            _mm_storeu_si128(b.qs.as_mut_ptr().add(16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(q));
            b.bsums[i] = _mm512_reduce_add_epi32(q) as i16;
        }
        b.d = 1.0 / iscale;
    }
}

/// One block unpacked for the VNNI sum.
struct Block {
    /// the 256 weights as u8, 64 per vector, in element order
    q: [__m512i; 4],
    /// word i of vector k: the scale of elements 64k + 2i and 64k + 2i + 1 (i16)
    sc: [__m512i; 4],
    /// multipliers of the activation's 16 `bsums` (i16): Q4_K / Q5_K the sub-block mins (the
    /// separate dmin term), Q6_K -32 · scale (its weights' offset, added to the scaled sum)
    bs: __m256i,
    d: f32,
    dmin: f32,
}

/// A K-quant format at this level: its block size and unpacking.
trait KFormat {
    const BB: usize;
    /// Whether the `bs` sum is the separate dmin term (Q4_K, Q5_K) or part of the scaled sum.
    const MIN: bool;
    fn unpack(wb: &[u8]) -> Block;
}

struct Q4K;
struct Q5K;
struct Q6K;

/// The 8 six-bit scales and 8 mins of a Q4_K / Q5_K block (`s`: its 12 scale bytes), one per
/// byte, as `q4k_scale_min` decodes them (GGML's bit shuffle on three little-endian words).
#[inline(always)]
pub(super) fn q4k_scales_mins(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let min_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    ((u0 & LOW6) as u64 | (sc_hi as u64) << 32, (u1 & LOW6) as u64 | (min_hi as u64) << 32)
}

/// Byte-shuffle indices spreading 8 scale bytes (broadcast to every 128-bit lane) over the i16
/// words of vector k: lanes 0-1 take scale 2k, lanes 2-3 scale 2k + 1 (high bytes zero).
const fn pair_scale_idx(k: usize) -> [u8; 64] {
    let mut idx = [0x80u8; 64];
    let mut p = 0;
    while p < 64 {
        idx[p] = (2 * k + p / 32) as u8;
        p += 2;
    }
    idx
}

const SC_IDX: [[u8; 64]; 4] = [pair_scale_idx(0), pair_scale_idx(1), pair_scale_idx(2), pair_scale_idx(3)];

/// Byte-shuffle indices spreading 8 mins (broadcast to both 128-bit lanes) over 16 i16 words:
/// min j on words 2j and 2j + 1 (the two bsums of sub-block j).
const MIN_IDX: [u8; 32] = {
    let mut idx = [0x80u8; 32];
    let mut p = 0;
    while p < 32 {
        idx[p] = (p / 4) as u8;
        p += 2;
    }
    idx
};

#[inline(always)]
fn load64(b: &[u8]) -> __m512i {
    assert!(b.len() >= 64);
    // SAFETY: 64 readable bytes (asserted); AVX-512F is enabled in the only caller.
    unsafe { _mm512_loadu_si512(b.as_ptr() as *const __m512i) }
}

#[inline(always)]
fn load32(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: 32 readable bytes (asserted); AVX is enabled in the only caller.
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

/// Q4_K / Q5_K: the nibbles of `qs` (128 bytes) in element order, their pair scales and the
/// mins as bsum multipliers.
#[inline(always)]
fn unpack_q45k(wb: &[u8], qs: &[u8]) -> Block {
    let (sc, mins) = q4k_scales_mins(&wb[4..16]);
    // SAFETY: AVX-512F/BW and AVX2 are enabled in the only caller; the index tables are 64 and
    // 32 readable bytes.
    unsafe {
        let nib = _mm512_set1_epi8(0x0F);
        let mut q = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // bytes 0..32 of each 64 hold sub-block 4h (low nibbles) and 4h + 1 (high); bytes
            // 32..64 sub-blocks 4h + 2 and 4h + 3
            let v = load64(&qs[64 * h..]);
            let lo = _mm512_and_si512(v, nib);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            q[2 * h] = _mm512_shuffle_i64x2::<0x44>(lo, hi);
            q[2 * h + 1] = _mm512_shuffle_i64x2::<0xEE>(lo, hi);
        }
        let scv = _mm512_set1_epi64(sc as i64);
        let sc = std::array::from_fn(|k| _mm512_shuffle_epi8(scv, _mm512_loadu_si512(SC_IDX[k].as_ptr() as *const __m512i)));
        let bs = _mm256_shuffle_epi8(_mm256_set1_epi64x(mins as i64), _mm256_loadu_si256(MIN_IDX.as_ptr() as *const __m256i));
        Block { q, sc, bs, d: f16x1(&wb[..2]), dmin: f16x1(&wb[2..4]) }
    }
}

impl KFormat for Q4K {
    const BB: usize = 144;
    const MIN: bool = true;
    #[inline(always)]
    fn unpack(wb: &[u8]) -> Block {
        unpack_q45k(wb, &wb[16..144])
    }
}

impl KFormat for Q5K {
    const BB: usize = 176;
    const MIN: bool = true;
    #[inline(always)]
    fn unpack(wb: &[u8]) -> Block {
        let mut b = unpack_q45k(wb, &wb[48..176]);
        // SAFETY: AVX-512F/BW are enabled in the only caller; the load reads qh = wb[16..48].
        unsafe {
            // bit j of qh[l] is the fifth bit of sub-block j's element l; vector k holds
            // sub-blocks 2k (bytes 0..32) and 2k + 1 (bytes 32..64)
            let qh = _mm512_broadcast_i64x4(load32(&wb[16..48]));
            for (k, q) in b.q.iter_mut().enumerate() {
                let bit = _mm512_mask_blend_epi8(0xFFFF_FFFF_0000_0000, _mm512_set1_epi8(1 << (2 * k)), _mm512_set1_epi8(1 << (2 * k + 1)));
                *q = _mm512_mask_add_epi8(*q, _mm512_test_epi8_mask(qh, bit), *q, _mm512_set1_epi8(16));
            }
        }
        b
    }
}

/// Word indices giving word i of vector k the scale of group (64k + 2i) / 16 = 4k + i / 8.
const fn q6_scale_idx(k: usize) -> [u16; 32] {
    let mut idx = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        idx[i] = (4 * k + i / 8) as u16;
        i += 1;
    }
    idx
}

const Q6_SC_IDX: [[u16; 32]; 4] = [q6_scale_idx(0), q6_scale_idx(1), q6_scale_idx(2), q6_scale_idx(3)];

impl KFormat for Q6K {
    const BB: usize = 210;
    const MIN: bool = false;
    /// Per half h (elements 128h..128h + 128): `ql` (64 bytes) holds elements 0..64 in its low
    /// nibbles and 64..128 in its high ones; `qh[l]` (32 bytes) the two high bits of elements
    /// l, 32 + l, 64 + l, 96 + l at bits 0, 2, 4, 6.
    #[inline(always)]
    fn unpack(wb: &[u8]) -> Block {
        // SAFETY: AVX-512F/BW and AVX2 are enabled in the only caller; loads stay inside the
        // 210-byte block; the index tables are 64 readable bytes each.
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            let bits45 = _mm512_set1_epi8(0x30);
            // shift each half's high bits to bits 4-5: elements 0..32 left 4, 32..64 left 2
            // (low nibbles), 64..96 none, 96..128 right 2 (high nibbles)
            let (shl, shr) = (_mm512_mask_blend_epi16(0xFFFF_0000, _mm512_set1_epi16(4), _mm512_set1_epi16(2)), _mm512_mask_blend_epi16(0xFFFF_0000, _mm512_setzero_si512(), _mm512_set1_epi16(2)));
            let mut q = [_mm512_setzero_si512(); 4];
            for h in 0..2 {
                let ql = load64(&wb[64 * h..]);
                let qh = _mm512_broadcast_i64x4(load32(&wb[128 + 32 * h..]));
                let hl = _mm512_and_si512(_mm512_sllv_epi16(qh, shl), bits45);
                let hh = _mm512_and_si512(_mm512_srlv_epi16(qh, shr), bits45);
                // (a & c) | b
                q[2 * h] = _mm512_ternarylogic_epi32::<0xEC>(ql, hl, nib);
                q[2 * h + 1] = _mm512_ternarylogic_epi32::<0xEC>(_mm512_srli_epi16::<4>(ql), hh, nib);
            }
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb[192..208].as_ptr() as *const __m128i));
            let scz = _mm512_castsi256_si512(sc16);
            let sc = std::array::from_fn(|k| _mm512_permutexvar_epi16(_mm512_loadu_si512(Q6_SC_IDX[k].as_ptr() as *const __m512i), scz));
            let bs = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16::<5>(sc16));
            Block { q, sc, bs, d: f16x1(&wb[208..]), dmin: 0.0 }
        }
    }
}

/// The block's exact integer sums against one activation block: (Σ scale · Σ q·x, Σ mult ·
/// bsum) for Q4_K / Q5_K; (Σ scale · Σ (q - 32)·x, 0) for Q6_K.
#[inline(always)]
fn sums<K: KFormat>(b: &Block, xb: &BlockQ8K) -> (i32, i32) {
    // SAFETY: AVX-512F/BW/VNNI and AVX2 are enabled in the only caller; the loads read 64 of
    // the 256 `qs` bytes each and the 32 bytes of `bsums`.
    unsafe {
        let x = xb.qs.as_ptr();
        let mut s = _mm512_setzero_si512();
        for k in 0..4 {
            let xv = _mm512_loadu_si512(x.add(64 * k) as *const __m512i);
            s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(b.q[k], xv), b.sc[k]);
        }
        let bs = _mm256_madd_epi16(_mm256_loadu_si256(xb.bsums.as_ptr() as *const __m256i), b.bs);
        let s8 = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
        if K::MIN {
            // [s01 s23 b01 b23 | s45 s67 b45 b67] -> [s b s b]
            let h = _mm256_hadd_epi32(s8, bs);
            let h = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let h = _mm_hadd_epi32(h, h);
            (_mm_cvtsi128_si32(h), _mm_extract_epi32::<1>(h))
        } else {
            let t = _mm256_add_epi32(s8, bs);
            let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
            let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t));
            (_mm_cvtsi128_si32(t), 0)
        }
    }
}

/// One row of format `K` against `NT` token rows: each block unpacked once, then per token the
/// reference's float formula on the exact sums, blocks in order.
#[inline(always)]
fn dot<K: KFormat, const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    let nb = w.len() / K::BB;
    let x = x.map(|xt| &xt[..nb]);
    let mut acc = [0f32; NT];
    for ib in 0..nb {
        prefetch(w, ib * K::BB);
        let b = K::unpack(&w[ib * K::BB..(ib + 1) * K::BB]);
        for t in 0..NT {
            let xb = &x[t][ib];
            let (s, m) = sums::<K>(&b, xb);
            acc[t] += if K::MIN {
                // d·Σ sc·Σ q·x - dmin·Σ m·bsum (`quant::dot_q8k_scalar`'s Q4_K, `dot_q5k_block`)
                let (d, dmin) = (b.d * xb.d, b.dmin * xb.d);
                d * s as f32 - dmin * m as f32
            } else {
                // d·Σ sc·Σ (q - 32)·x (Q6_K)
                b.d * xb.d * s as f32
            };
        }
    }
    *out = acc;
}

#[cfg(test)]
mod tests {
    use super::q4k_scales_mins;
    use crate::gguf::types::q4k_scale_min;

    /// The word-parallel scale decoding equals the reference's per-index one on every byte
    /// pattern position (pseudo-random scale bytes).
    #[test]
    fn q4k_scales_mins_equal_reference() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let bytes: [u8; 12] = std::array::from_fn(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            });
            let (sc, mins) = q4k_scales_mins(&bytes);
            for j in 0..8 {
                let (rs, rm) = q4k_scale_min(j, &bytes);
                assert_eq!(((sc >> (8 * j)) as u8, (mins >> (8 * j)) as u8), (rs, rm), "j {j}, bytes {bytes:?}");
            }
        }
    }
}
