//! AVX-512 VNNI kernels (x86-64) for Q4_0 / Q4_1 / Q5_0 / Q8_0 weights: `vpdpbusd` multiplies 64 u8
//! weights by 64 i8 activations and adds groups of four into 16 i32 lanes, so one instruction
//! covers two 32-weight blocks. Chosen at run time by `SimdLevel::detect` (avx512f, avx512bw,
//! avx512vl, avx512vnni, plus the AVX2 set that the other kernels of this level reuse); each
//! function computes what its scalar twin in `quant.rs` computes, in a different float summation
//! order (tested against it with an explicit tolerance in `cpu::tests`).
//!
//! Activations are repacked per token into [`PairQ8`]: two blocks' bytes in the lane order that
//! the weight unpacking produces, with their scales and sums already spread over the lanes, so
//! the per-token work of a block pair is one `vpdpbusd`, one conversion, one multiply and one FMA.
//! The i32 lanes are never summed across blocks (each pair starts a fresh integer sum); float
//! lanes are summed once at the end of the row, in the same order for every token tile size.
//!
//! Q8_0 (Gemma's tied 262k-row output projection, most of the bytes a decode step reads) takes
//! plain [`BlockQ8`] activations instead and runs two weight *rows* per vector: each 256-bit half
//! repeats `avx2`'s Q8_0 arithmetic lane for lane, so its results equal that kernel's bitwise
//! (`matmul_rows_q8_0`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::avx2::{dot_q8_0, hsum, load_qs};
use super::quant::BlockQ8;
use super::shared::{prefetch, tile_rows_with8, SharedOut};
use crate::backend::WeightView;
use crate::gguf::{GgmlType, QK};

/// Two 32-value activation blocks (b0, b1) in the lane order of the unpacked weights:
/// `qs` = [b0[0..16], b1[0..16], b0[16..32], b1[16..32]], so i32 lane l of `vpdpbusd` covers
/// block `(l / 4) % 2`. A row with an odd block count ends with a pair whose b1 is all zero.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub struct PairQ8 {
    /// [64] quantized values of the two blocks, in the lane order above
    pub qs: [i8; 64],
    /// the scale `d` of the lane's block, per i32 lane
    pub d: [f32; 16],
    /// minus the sum of the lane's four `qs` (offset weights: Σ(u - k)·x = Σu·x - k·Σx)
    pub nsum: [i32; 16],
    /// [b0.s, b1.s, 0, 0] (Q4_1's offset term)
    pub s: [f32; 4],
}

impl Default for PairQ8 {
    fn default() -> Self {
        PairQ8 { qs: [0; 64], d: [0.0; 16], nsum: [0; 16], s: [0.0; 4] }
    }
}

/// Quantizes `x` (length a multiple of 32) with exactly `quant::quantize_q8`'s arithmetic
/// (same `qs`, `d`, `s`), into `x.len().div_ceil(64)` pairs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn quantize_pairs(x: &[f32], out: &mut [PairQ8]) {
    assert!(out.len() == (x.len() / QK).div_ceil(2));
    let mut b1 = [BlockQ8::default(); 2];
    for (p, xs) in out.iter_mut().zip(x.chunks(2 * QK)) {
        b1[1] = BlockQ8::default();
        for (b, bx) in b1.iter_mut().zip(xs.chunks_exact(QK)) {
            *b = quantize_block(bx);
        }
        pack_pair(&b1[0], &b1[1], p);
    }
}

/// Quantizes `x` (length a multiple of 32) into `out` (len x.len() / 32) with exactly
/// `quant::quantize_q8`'s arithmetic (same `qs`, `d`, `s`): the blocks the Q8_0 kernel reads.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        *b = quantize_block(xs);
    }
}

/// One block of `quant::quantize_block_q8`, vectorized (bitwise the same result).
#[inline(always)]
fn quantize_block(xs: &[f32]) -> BlockQ8 {
    quantize_block_sum(xs).0
}

/// [`quantize_block`] and the sum of its `qs`. Only inlined into functions with this level's
/// features enabled (as everything here).
#[inline(always)]
pub(super) fn quantize_block_sum(xs: &[f32]) -> (BlockQ8, i32) {
    assert!(xs.len() == QK);
    let mut b = BlockQ8::default();
    // SAFETY: AVX-512F/BW/VL are enabled in the caller; the loads read xs[0..32] (asserted), the
    // stores write b.qs[0..32].
    unsafe {
        let lo = _mm512_loadu_ps(xs.as_ptr());
        let hi = _mm512_loadu_ps(xs.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        // round half to even (the default MXCSR mode), as `round_ties_even`
        let rlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id));
        let rhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(rlo, rhi));
        _mm_storeu_si128(b.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(rlo));
        _mm_storeu_si128(b.qs.as_mut_ptr().add(16) as *mut __m128i, _mm512_cvtepi32_epi8(rhi));
        b.d = half::f16::from_f32(d).to_f32();
        b.s = half::f16::from_f32(d * sum as f32).to_f32();
        (b, sum)
    }
}

/// Lays out two quantized blocks as a [`PairQ8`].
pub fn pack_pair(b0: &BlockQ8, b1: &BlockQ8, p: &mut PairQ8) {
    p.qs[0..16].copy_from_slice(&b0.qs[0..16]);
    p.qs[16..32].copy_from_slice(&b1.qs[0..16]);
    p.qs[32..48].copy_from_slice(&b0.qs[16..32]);
    p.qs[48..64].copy_from_slice(&b1.qs[16..32]);
    for lane in 0..16 {
        let b = if (lane / 4) % 2 == 0 { b0 } else { b1 };
        p.d[lane] = b.d;
        p.nsum[lane] = -p.qs[4 * lane..4 * lane + 4].iter().map(|&q| q as i32).sum::<i32>();
    }
    p.s = [b0.s, b1.s, 0.0, 0.0];
}

/// The weight types with a pair kernel here.
pub const PAIR_TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0];

/// Rows `rows` of a Q4_0 / Q4_1 / Q5_0 matrix against `n_tok` activation rows (`acts`:
/// [n_tok, (cols / 32).div_ceil(2)] pairs), in token tiles of 8 (then 4, then single tokens). (Q8_0 has
/// no pair form: it needed two loads and a two-source permute per pair and measured slower than
/// AVX2, docs/perf.md; see [`matmul_rows_q8_0`].)
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn matmul_rows_q8(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[PairQ8], n_tok: usize, out: &SharedOut) {
    let np = (w.cols / QK).div_ceil(2);
    match w.ty {
        GgmlType::Q4_0 => tile_rows_with8(w, rows, acts, np, n_tok, out, dot_pairs::<Q4_0, 8>, dot_pairs::<Q4_0, 4>, dot_pairs::<Q4_0, 1>),
        GgmlType::Q4_1 => tile_rows_with8(w, rows, acts, np, n_tok, out, dot_pairs::<Q4_1, 8>, dot_pairs::<Q4_1, 4>, dot_pairs::<Q4_1, 1>),
        GgmlType::Q5_0 => tile_rows_with8(w, rows, acts, np, n_tok, out, dot_pairs::<Q5_0, 8>, dot_pairs::<Q5_0, 4>, dot_pairs::<Q5_0, 1>),
        other => unreachable!("avx512::matmul_rows_q8 called for {other:?}"),
    }
}

// Everything below is `inline(always)` and only ever inlined into `matmul_rows_q8`, whose
// features the backend checked at run time before choosing this level.

/// The first `n` bytes of `b[at..]` in a zmm, the rest zero.
#[inline(always)]
fn load_n(b: &[u8], at: usize, n: usize) -> __m512i {
    assert!(n <= 64 && at + n <= b.len());
    let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    // SAFETY: AVX-512BW is enabled in the caller; the masked load touches only bytes
    // at..at+n, which are in bounds (asserted); unselected bytes are neither read nor faulted.
    unsafe { _mm512_maskz_loadu_epi8(mask, b.as_ptr().add(at) as *const i8) }
}

/// A word-permutation index: output word i = input word `idx[i]`.
#[inline(always)]
fn widx(idx: [u16; 32]) -> __m512i {
    // SAFETY: AVX-512F is enabled in the caller; `idx` is 64 readable bytes.
    unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) }
}

/// Word indices spreading scale words `a` (block 0) and `b` (block 1) over the i32 lanes of a
/// pair: 16 f16 = [a ×4, b ×4, a ×4, b ×4] (upper 16 words unused).
const fn scale_idx(a: u16, b: u16) -> [u16; 32] {
    let mut idx = [0u16; 32];
    let mut i = 0;
    while i < 16 {
        idx[i] = if (i / 4) % 2 == 0 { a } else { b };
        i += 1;
    }
    idx
}

/// Word indices gathering two blocks' 16 nibble bytes twice: [q0, q1, q0, q1] where q0 starts
/// at word `a` and q1 at word `b` (8 words each); `nibbles` then takes the low nibbles from the
/// first copy and the high nibbles from the second.
const fn bytes_idx(a: u16, b: u16) -> [u16; 32] {
    let mut idx = [0u16; 32];
    let mut i = 0;
    while i < 8 {
        idx[i] = a + i as u16;
        idx[8 + i] = b + i as u16;
        idx[16 + i] = a + i as u16;
        idx[24 + i] = b + i as u16;
        i += 1;
    }
    idx
}

/// A weight format read two blocks at a time.
trait PairFormat {
    /// bytes of a block pair
    const PB: usize;
    /// the pair's integer sums start at `nsum << SHIFT` (0: no offset; 3: weights are u - 8;
    /// 4: u - 16), so each i32 lane is the exact integer dot of its four weights
    const SHIFT: u32;
    /// whether to add the m·s terms (Q4_1)
    const MIN: bool;
    /// `b`: a whole pair (`full`) or the row's last, lone block.
    fn unpack(b: &[u8], full: bool) -> Unpacked;
}

struct Q4_0;
struct Q4_1;
struct Q5_0;

/// One weight pair unpacked: 64 u8 weights in `PairQ8` lane order, the weight scale per lane
/// (f32), and for Q4_1 the mins [m0, m1, m0, m1].
struct Unpacked {
    q: __m512i,
    d: __m512,
    m: __m128,
}

/// f16 words 0..16 of `v` as 16 f32.
#[inline(always)]
fn f16x16(v: __m512i) -> __m512 {
    // SAFETY: AVX-512F is enabled in the caller.
    unsafe { _mm512_cvtph_ps(_mm512_castsi512_si256(v)) }
}

/// Nibble weights: `p` holds the pair's bytes; `qi` gathers [q0, q1, q0, q1]; the upper 32
/// bytes take the high nibbles.
#[inline(always)]
fn nibbles(p: __m512i, qi: __m512i) -> __m512i {
    // SAFETY: AVX-512F/BW are enabled in the caller.
    unsafe {
        let q = _mm512_permutexvar_epi16(qi, p);
        let q = _mm512_mask_srli_epi16::<4>(q, 0xFFFF_0000, q);
        _mm512_and_si512(q, _mm512_set1_epi8(0x0F))
    }
}

/// Q4_1's mins m0 (word 1) and m1 (word 11) as [m0, m1, m0, m1].
const Q4_1_MIN: [u16; 32] = {
    let mut idx = [0u16; 32];
    idx[0] = 1;
    idx[1] = 11;
    idx[2] = 1;
    idx[3] = 11;
    idx
};

impl PairFormat for Q4_1 {
    const PB: usize = 40;
    const SHIFT: u32 = 0;
    const MIN: bool = true;
    #[inline(always)]
    fn unpack(b: &[u8], full: bool) -> Unpacked {
        // pair: d0 m0 qs0[16] d1 m1 qs1[16]; words: d0 0, m0 1, qs0 2..10, d1 10, m1 11, qs1 12..20
        let p = load_n(b, 0, if full { 40 } else { 20 });
        // SAFETY: AVX-512F/BW and F16C are enabled in the caller.
        unsafe {
            let q = nibbles(p, widx(bytes_idx(2, 12)));
            let d = f16x16(_mm512_permutexvar_epi16(widx(scale_idx(0, 10)), p));
            let m = _mm_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(widx(Q4_1_MIN), p)));
            Unpacked { q, d, m }
        }
    }
}

impl PairFormat for Q4_0 {
    const PB: usize = 36;
    const SHIFT: u32 = 3;
    const MIN: bool = false;
    #[inline(always)]
    fn unpack(b: &[u8], full: bool) -> Unpacked {
        // pair: d0 qs0[16] d1 qs1[16]; words: d0 0, qs0 1..9, d1 9, qs1 10..18
        let p = load_n(b, 0, if full { 36 } else { 18 });
        // SAFETY: AVX-512F/BW and SSE are enabled in the caller.
        unsafe {
            let q = nibbles(p, widx(bytes_idx(1, 10)));
            let d = f16x16(_mm512_permutexvar_epi16(widx(scale_idx(0, 9)), p));
            Unpacked { q, d, m: _mm_setzero_ps() }
        }
    }
}

impl PairFormat for Q5_0 {
    const PB: usize = 44;
    const SHIFT: u32 = 4;
    const MIN: bool = false;
    #[inline(always)]
    fn unpack(b: &[u8], full: bool) -> Unpacked {
        // pair: d0 qh0[4] qs0[16] d1 qh1[4] qs1[16]; words: d0 0, qs0 3..11, d1 11, qs1 14..22
        let p = load_n(b, 0, if full { 44 } else { 22 });
        let qh = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as u64;
        let (h0, h1) = (qh(2), if full { qh(24) } else { 0 });
        // The fifth bits in `PairQ8` lane order: [b0 0..16, b1 0..16, b0 16..32, b1 16..32].
        let fifth = (h0 & 0xFFFF) | ((h1 & 0xFFFF) << 16) | ((h0 >> 16) << 32) | ((h1 >> 16) << 48);
        // SAFETY: AVX-512F/BW and F16C are enabled in the caller.
        unsafe {
            let q = nibbles(p, widx(bytes_idx(3, 14)));
            let q = _mm512_mask_add_epi8(q, fifth, q, _mm512_set1_epi8(16));
            let d = f16x16(_mm512_permutexvar_epi16(widx(scale_idx(0, 11)), p));
            Unpacked { q, d, m: _mm_setzero_ps() }
        }
    }
}

/// One weight row of format `F` against `NT` activation rows.
#[inline(always)]
fn dot_pairs<F: PairFormat, const NT: usize>(w: &[u8], x: [&[PairQ8]; NT], out: &mut [f32; NT]) {
    let (pairs, tail) = (w.len() / F::PB, w.len() % F::PB);
    let np = pairs + usize::from(tail != 0);
    let x = x.map(|xt| &xt[..np]);
    let mut acc = [zero512(); NT];
    let mut macc = [zero128(); NT];
    for ip in 0..pairs {
        prefetch(w, ip * F::PB);
        step::<F, NT>(&F::unpack(&w[ip * F::PB..(ip + 1) * F::PB], true), x, ip, &mut acc, &mut macc);
    }
    if tail != 0 {
        step::<F, NT>(&F::unpack(&w[pairs * F::PB..], false), x, pairs, &mut acc, &mut macc);
    }
    for t in 0..NT {
        out[t] = hsum512(acc[t]) + if F::MIN { hsum128(macc[t]) } else { 0.0 };
    }
}

#[inline(always)]
fn zero512() -> __m512 {
    // SAFETY: AVX-512F is enabled in the caller.
    unsafe { _mm512_setzero_ps() }
}

#[inline(always)]
fn zero128() -> __m128 {
    // SAFETY: SSE is baseline on x86-64.
    unsafe { _mm_setzero_ps() }
}

/// Pair `ip` of every token against the unpacked weights `u`.
#[inline(always)]
fn step<F: PairFormat, const NT: usize>(u: &Unpacked, x: [&[PairQ8]; NT], ip: usize, acc: &mut [__m512; NT], macc: &mut [__m128; NT]) {
    for t in 0..NT {
        let a = &x[t][ip];
        // SAFETY: AVX-512F/BW/VNNI are enabled in the only caller; the loads read whole fields
        // of a 64-byte-aligned `PairQ8`.
        unsafe {
            let nsum = || _mm512_load_si512(a.nsum.as_ptr() as *const __m512i);
            let init = match F::SHIFT {
                0 => _mm512_setzero_si512(),
                3 => _mm512_slli_epi32::<3>(nsum()),
                _ => _mm512_slli_epi32::<4>(nsum()),
            };
            let sumi = _mm512_dpbusd_epi32(init, u.q, _mm512_load_si512(a.qs.as_ptr() as *const __m512i));
            let sc = _mm512_mul_ps(u.d, _mm512_load_ps(a.d.as_ptr()));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), sc, acc[t]);
            if F::MIN {
                macc[t] = _mm_fmadd_ps(u.m, _mm_load_ps(a.s.as_ptr()), macc[t]);
            }
        }
    }
}

#[inline(always)]
fn hsum128(s: __m128) -> f32 {
    // SAFETY: SSE is baseline on x86-64.
    unsafe {
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

#[inline(always)]
fn hsum512(v: __m512) -> f32 {
    // SAFETY: AVX-512F is enabled in the caller.
    unsafe {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        hsum128(_mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s)))
    }
}

/// Rows `rows` of a Q8_0 matrix against `n_tok` activation rows (`acts`: [n_tok, cols / 32]),
/// two rows per 512-bit vector, in token tiles of 4 (then single tokens). Lanes 0..8 hold row r,
/// lanes 8..16 row r + 1, and each half computes what `avx2`'s Q8_0 dot computes in its 8 lanes:
/// the same exact 4-product integer sums (`vpdpbusd` of |w| and x signed by w, instead of
/// `maddubs` + `madd`), one FMA per block by the same f32 product d·d_x, the same final
/// horizontal sum. So every result equals the AVX2 kernel's bitwise, and a row left alone at the
/// end of `rows` goes through that kernel itself.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn matmul_rows_q8_0(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
    let nb = w.cols / QK;
    let act = |t: usize| &acts[t * nb..(t + 1) * nb];
    let mut t0 = 0;
    while t0 + 4 <= n_tok {
        q8_0_rows::<4>(w, rows.clone(), [act(t0), act(t0 + 1), act(t0 + 2), act(t0 + 3)], t0, out);
        t0 += 4;
    }
    for t in t0..n_tok {
        q8_0_rows::<1>(w, rows.clone(), [act(t)], t, out);
    }
}

/// Rows `rows` against the tokens `t0..t0 + NT`: pairs of rows, then a lone last row.
#[inline(always)]
fn q8_0_rows<const NT: usize>(w: WeightView<'_>, rows: std::ops::Range<usize>, x: [&[BlockQ8]; NT], t0: usize, out: &SharedOut) {
    let mut r = rows.start;
    while r + 2 <= rows.end {
        let o = dot_q8_0_rows::<NT>(w.row(r), w.row(r + 1), x);
        for (t, [a, b]) in o.into_iter().enumerate() {
            out.write(t0 + t, r, a);
            out.write(t0 + t, r + 1, b);
        }
        r += 2;
    }
    if r < rows.end {
        let mut o = [0f32; NT];
        dot_q8_0::<NT>(w.row(r), x, &mut o);
        for (t, v) in o.into_iter().enumerate() {
            out.write(t0 + t, r, v);
        }
    }
}

/// Two Q8_0 rows (`w0`, `w1`: adjacent rows of one matrix) against `NT` activation rows.
#[inline(always)]
fn dot_q8_0_rows<const NT: usize>(w0: &[u8], w1: &[u8], x: [&[BlockQ8]; NT]) -> [[f32; 2]; NT] {
    let (b0, _) = w0.as_chunks::<34>();
    let (b1, _) = w1.as_chunks::<34>();
    let nb = b0.len();
    let (b1, x) = (&b1[..nb], x.map(|xt| &xt[..nb]));
    let f16_bits = |b: &[u8; 34]| i16::from_le_bytes([b[0], b[1]]);
    // SAFETY (whole body): only inlined into `matmul_rows_q8_0` (AVX2, F16C, FMA, AVX-512
    // F/BW/VL/VNNI enabled); loads read 32 bytes inside a 34-byte block or a `BlockQ8`.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); NT];
        for ib in 0..nb {
            // the two rows are one stream of 68 bytes per block
            prefetch(w0, 2 * ib * 34);
            let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load32(&b0[ib][2..])), load32(&b1[ib][2..]));
            let neg = _mm512_movepi8_mask(q);
            let qa = _mm512_abs_epi8(q);
            let d = _mm512_cvtph_ps(_mm256_mask_set1_epi16(_mm256_set1_epi16(f16_bits(&b0[ib])), 0xFF00, f16_bits(&b1[ib])));
            for t in 0..NT {
                let xb = &x[t][ib];
                let xv = _mm512_broadcast_i64x4(load_qs(xb));
                let xs = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                let p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qa, xs));
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), p, acc[t]);
            }
        }
        acc.map(|a| [hsum(_mm512_castps512_ps256(a)), hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a))))])
    }
}

#[inline(always)]
fn load32(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: 32 readable bytes (asserted); AVX is enabled in the only caller.
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}
