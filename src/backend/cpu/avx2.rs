//! AVX2 + FMA + F16C dot products (x86-64). Chosen at run time by `SimdLevel::detect`; each
//! function computes exactly what its scalar twin in `quant.rs` computes, in a different float
//! summation order (tested against it with an explicit tolerance in `cpu::tests`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::quant::BlockQ8;
use super::shared::{prefetch, tile_rows, SharedOut};
use crate::backend::WeightView;
use crate::gguf::types::{e8m0_half, IQ4NL_VALUES, MXFP4_VALUES};
use crate::gguf::GgmlType;

// The helpers below are `inline(always)` plain functions: they are only ever inlined into the
// `#[target_feature]` entry points of this file (which the backend calls after run-time
// detection), so their intrinsics run with AVX2/FMA/F16C enabled. That lets the whole kernel
// inline into one function with the features on.

#[inline(always)]
fn load16(b: &[u8]) -> __m128i {
    assert!(b.len() >= 16);
    // SAFETY: the assert guarantees 16 readable bytes; loadu has no alignment requirement.
    unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
}

#[inline(always)]
pub(super) fn load32(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: the assert guarantees 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

#[inline(always)]
pub(super) fn load_qs(x: &BlockQ8) -> __m256i {
    // SAFETY: `qs` is [i8; 32]: 32 readable bytes, i8 and u8 share layout.
    unsafe { _mm256_loadu_si256(x.qs.as_ptr() as *const __m256i) }
}

#[inline(always)]
fn load8f(x: &[f32]) -> __m256 {
    assert!(x.len() >= 8);
    // SAFETY: the assert guarantees 8 readable floats; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// Two adjacent little-endian f16 at `b[0..4]` as f32.
#[inline(always)]
fn f16x2(b: &[u8]) -> (f32, f32) {
    let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    // SAFETY: F16C is enabled in every caller (see above).
    unsafe {
        let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
        (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps(v, v, 1)))
    }
}

#[inline(always)]
pub(super) fn f16x1(b: &[u8]) -> f32 {
    let bits = u16::from_le_bytes([b[0], b[1]]) as i32;
    // SAFETY: F16C is enabled in every caller (see above).
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))) }
}

/// Sum of the 8 lanes: (lo + hi) halves, then elements 0+2 and 1+3, then those two.
#[inline(always)]
pub(super) fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX is enabled in every caller (see above).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

/// Unpacks 16 bytes of nibbles into 32 u8: low nibbles first (elements 0..16), high after.
#[inline(always)]
fn nibbles(qs: &[u8]) -> __m256i {
    let q = load16(qs);
    // SAFETY: AVX2 is enabled in every caller (see above).
    unsafe {
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, m);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_set_m128i(hi, lo)
    }
}

/// Sum of u8 × i8 products of 32 lanes as 8 f32 partial sums.
#[inline(always)]
fn mul_sum_u8_i8(u: __m256i, s: __m256i) -> __m256 {
    // SAFETY: AVX2 is enabled in every caller (see above).
    unsafe {
        let p16 = _mm256_maddubs_epi16(u, s);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
}

// Token tiles: each quantized kernel computes one weight row against `NT` activation rows,
// unpacking each weight block once. Every token's accumulator sees the same instruction sequence
// whatever `NT` is, so results are bitwise identical to the `NT = 1` (decode) call.

/// The 32-element block types with a kernel here.
pub const Q8_TYPES: [GgmlType; 7] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4NL, GgmlType::MXFP4];

/// Rows `rows` of a matrix of a 32-element block type ([`Q8_TYPES`]) against `n_tok` quantized
/// activation rows (`acts`: [n_tok, cols / 32]), in token tiles of 4 (then single tokens),
/// written to `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub fn matmul_rows_q8(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
    match w.ty {
        GgmlType::Q4_0 => tile_rows(w, rows, acts, n_tok, out, dot_q4_0::<4>, dot_q4_0::<1>),
        GgmlType::Q4_1 => tile_rows(w, rows, acts, n_tok, out, dot_q4_1::<4>, dot_q4_1::<1>),
        GgmlType::Q5_0 => tile_rows(w, rows, acts, n_tok, out, dot_q5_0::<4>, dot_q5_0::<1>),
        GgmlType::Q5_1 => tile_rows(w, rows, acts, n_tok, out, dot_q5_1::<4>, dot_q5_1::<1>),
        GgmlType::IQ4NL => tile_rows(w, rows, acts, n_tok, out, dot_iq4nl::<4>, dot_iq4nl::<1>),
        GgmlType::MXFP4 => tile_rows(w, rows, acts, n_tok, out, dot_mxfp4::<4>, dot_mxfp4::<1>),
        GgmlType::Q8_0 => tile_rows(w, rows, acts, n_tok, out, dot_q8_0::<4>, dot_q8_0::<1>),
        other => unreachable!("avx2::matmul_rows_q8 called for {other:?}"),
    }
}

/// The row's blocks as fixed-size arrays, and every activation row cut to exactly as many
/// blocks, so the block loop indexes without bounds checks.
#[inline(always)]
pub(super) fn blocks<'a, A, const BB: usize, const NT: usize>(w: &'a [u8], x: [&'a [A]; NT]) -> (&'a [[u8; BB]], [&'a [A]; NT]) {
    let (blocks, _) = w.as_chunks::<BB>();
    let nb = blocks.len();
    (blocks, x.map(|xt| &xt[..nb]))
}

/// Blocks of a scale (`scale(block)`) and 32 signed weights (`weights(block)` gives them as i8
/// lanes, elements in order): the Q4_0, Q5_0, Q8_0, IQ4_NL and MXFP4 dot, with the sign trick
/// for `maddubs`.
#[inline(always)]
fn dot_signed<const BB: usize, const NT: usize>(
    w: &[u8],
    x: [&[BlockQ8]; NT],
    out: &mut [f32; NT],
    scale: impl Fn(&[u8; BB]) -> f32,
    weights: impl Fn(&[u8; BB]) -> __m256i,
) {
    let (blocks, x) = blocks::<BlockQ8, BB, NT>(w, x);
    // SAFETY (whole body): only inlined into `matmul_rows_q8` (avx2, fma, f16c enabled).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NT];
        for (ib, wb) in blocks.iter().enumerate() {
            prefetch(w, ib * BB);
            let d = scale(wb);
            let q = weights(wb);
            let qa = _mm256_sign_epi8(q, q);
            for t in 0..NT {
                let xb = &x[t][ib];
                let p = mul_sum_u8_i8(qa, _mm256_sign_epi8(load_qs(xb), q));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), p, acc[t]);
            }
        }
        for t in 0..NT {
            out[t] = hsum(acc[t]);
        }
    }
}

#[inline(always)]
fn f16_scale<const BB: usize>(wb: &[u8; BB]) -> f32 {
    f16x1(&wb[..2])
}

#[inline(always)]
fn dot_q4_0<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    // SAFETY: AVX2 enabled in every caller; nibbles minus 8 are the signed weights.
    dot_signed::<18, NT>(w, x, out, f16_scale, |wb: &[u8; 18]| unsafe { _mm256_sub_epi8(nibbles(&wb[2..18]), _mm256_set1_epi8(8)) })
}

#[inline(always)]
pub(super) fn dot_q8_0<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    dot_signed::<34, NT>(w, x, out, f16_scale, |wb: &[u8; 34]| load32(&wb[2..34]))
}

/// 0xFF in byte j where bit j of the little-endian u32 at `b[..4]` is set (a Q5 block's `qh`).
#[inline(always)]
fn bit_bytes(b: &[u8]) -> __m256i {
    let bits = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    // SAFETY: AVX2 is enabled in every caller (see above).
    unsafe {
        // byte j takes byte j / 8 of the word, then the mask with every bit but j % 8 set
        let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
        let probe = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(probe, _mm256_set1_epi64x(-1))
    }
}

#[inline(always)]
fn dot_q5_0<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    // q - 16 = the nibble where the fifth bit is set, the nibble with 0xF0 (i.e. - 16) where not.
    // SAFETY: AVX2 enabled in every caller.
    dot_signed::<22, NT>(w, x, out, f16_scale, |wb: &[u8; 22]| unsafe {
        _mm256_or_si256(nibbles(&wb[6..22]), _mm256_andnot_si256(bit_bytes(&wb[2..6]), _mm256_set1_epi8(0xF0u8 as i8)))
    })
}

/// Nibbles looked up in a 16-entry table of i8 levels (IQ4_NL, MXFP4).
#[inline(always)]
fn levels(qs: &[u8], table: &[i8; 16]) -> __m256i {
    // SAFETY: AVX2 is enabled in every caller; the table is 16 readable bytes.
    unsafe {
        let t = _mm_loadu_si128(table.as_ptr() as *const __m128i);
        _mm256_shuffle_epi8(_mm256_set_m128i(t, t), nibbles(qs))
    }
}

#[inline(always)]
fn dot_iq4nl<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    dot_signed::<18, NT>(w, x, out, f16_scale, |wb: &[u8; 18]| levels(&wb[2..18], &IQ4NL_VALUES))
}

#[inline(always)]
fn dot_mxfp4<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    dot_signed::<17, NT>(w, x, out, |wb: &[u8; 17]| e8m0_half(wb[0]), |wb: &[u8; 17]| levels(&wb[1..17], &MXFP4_VALUES))
}

/// Blocks of f16 scale and min and 32 unsigned weights (`weights(block)`): the Q4_1 and Q5_1
/// dot, d·Σ q·x + m·s.
#[inline(always)]
fn dot_offset<const BB: usize, const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT], weights: impl Fn(&[u8; BB]) -> __m256i) {
    let (blocks, x) = blocks::<BlockQ8, BB, NT>(w, x);
    // SAFETY (whole body): only inlined into `matmul_rows_q8` (avx2, fma, f16c enabled).
    unsafe {
        let mut acc = [_mm256_setzero_ps(); NT];
        let mut summ = [0f32; NT];
        for (ib, wb) in blocks.iter().enumerate() {
            prefetch(w, ib * BB);
            let (d, m) = f16x2(&wb[..4]);
            let q = weights(wb);
            for t in 0..NT {
                let xb = &x[t][ib];
                let p = mul_sum_u8_i8(q, load_qs(xb));
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), p, acc[t]);
                summ[t] += m * xb.s;
            }
        }
        for t in 0..NT {
            out[t] = hsum(acc[t]) + summ[t];
        }
    }
}

#[inline(always)]
fn dot_q4_1<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    dot_offset::<20, NT>(w, x, out, |wb: &[u8; 20]| nibbles(&wb[4..20]))
}

#[inline(always)]
fn dot_q5_1<const NT: usize>(w: &[u8], x: [&[BlockQ8]; NT], out: &mut [f32; NT]) {
    // SAFETY: AVX2 enabled in every caller; the fifth bits as 0x10 on the nibbles.
    dot_offset::<24, NT>(w, x, out, |wb: &[u8; 24]| unsafe {
        _mm256_or_si256(nibbles(&wb[8..24]), _mm256_and_si256(bit_bytes(&wb[4..8]), _mm256_set1_epi8(0x10)))
    })
}

/// Most query heads sharing one KV head that `attend_range` takes at once.
pub const MAX_GROUP: usize = 8;

/// Attention of `g` query heads (`q`: [g, hd]) that share one KV head, over the keys `range`
/// (its start a multiple of `ops::ATT_TILE`, so tiles stay at absolute positions): each key and
/// value row is converted from f16 once for the whole group. Per head the arithmetic follows
/// `ops::attend_head` (same tiles, key order and softmax), so a query's result never depends on
/// the batch or on the other heads. With `ml` ([g, 2]) the output is left unnormalized and each
/// head's running max and sum are written to `ml[2h]`, `ml[2h + 1]`, for
/// `CpuBackend::attention` to merge the segments of a long context.
///
/// Keys are converted [`SUB`] at a time into a small f32 tile; scores are computed eight keys at
/// a time (eight independent FMA chains, then one transposing reduction that adds exactly the
/// pairs `hsum` adds, so each score is bitwise `dot8`'s), and each head's output accumulates a
/// sub-tile's values in registers (`accumulate`: the same FMA per element, in key order, as one
/// FMA per key).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub fn attend_range(
    q: &[f32],
    keys: &[half::f16],
    vals: &[half::f16],
    range: std::ops::Range<usize>,
    hd: usize,
    scale: f32,
    out: &mut [f32],
    ml: Option<&mut [f32]>,
) {
    const T: usize = super::ops::ATT_TILE;
    const SUB: usize = 32;
    let g = q.len() / hd;
    let n_keys = range.end;
    assert!(hd % 8 == 0 && hd <= 256 && g <= MAX_GROUP && out.len() == q.len());
    assert!(keys.len() >= n_keys * hd && vals.len() >= n_keys * hd && range.start % T == 0);
    let mut scores = [[0f32; T]; MAX_GROUP];
    let mut m = [f32::NEG_INFINITY; MAX_GROUP];
    let mut l = [0f32; MAX_GROUP];
    let mut tile = [0f32; SUB * 256];
    let mut e = [0f32; SUB];
    out.fill(0.0);
    let mut start = range.start;
    while start < n_keys {
        let end = (start + T).min(n_keys);
        let mut tile_max = [f32::NEG_INFINITY; MAX_GROUP];
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            for j in 0..n {
                f16_row(&keys[(s0 + j) * hd..(s0 + j + 1) * hd], &mut tile[j * hd..(j + 1) * hd]);
            }
            for h in 0..g {
                let qh = &q[h * hd..(h + 1) * hd];
                let sc = &mut scores[h][s0 - start..s0 - start + n];
                let mut j = 0;
                while j + 8 <= n {
                    dots8(qh, &tile[j * hd..(j + 8) * hd], &mut sc[j..j + 8]);
                    j += 8;
                }
                for (jj, s) in sc.iter_mut().enumerate().skip(j) {
                    *s = dot8(qh, &tile[jj * hd..(jj + 1) * hd]);
                }
                for s in sc.iter_mut() {
                    *s *= scale;
                    tile_max[h] = tile_max[h].max(*s);
                }
            }
        }
        let mut e_scale = [0f32; MAX_GROUP];
        for h in 0..g {
            let m_new = m[h].max(tile_max[h]);
            let corr = (m[h] - m_new).exp();
            l[h] *= corr;
            for o in out[h * hd..(h + 1) * hd].iter_mut() {
                *o *= corr;
            }
            m[h] = m_new;
            e_scale[h] = m_new;
        }
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            for j in 0..n {
                f16_row(&vals[(s0 + j) * hd..(s0 + j + 1) * hd], &mut tile[j * hd..(j + 1) * hd]);
            }
            for h in 0..g {
                for j in 0..n {
                    e[j] = (scores[h][s0 - start + j] - e_scale[h]).exp();
                    l[h] += e[j];
                }
                accumulate(&mut out[h * hd..(h + 1) * hd], &e[..n], &tile[..n * hd]);
            }
        }
        start = end;
    }
    if let Some(ml) = ml {
        for h in 0..g {
            ml[2 * h] = m[h];
            ml[2 * h + 1] = l[h];
        }
        return;
    }
    for h in 0..g {
        let inv = if l[h] > 0.0 { 1.0 / l[h] } else { 0.0 };
        for o in out[h * hd..(h + 1) * hd].iter_mut() {
            *o *= inv;
        }
    }
}

/// Eight dots of `q` with the rows of `k8` ([8, hd]): per row the FMA chain of `dot8`, then the
/// eight `hsum`s done together: lanes i and i+4 added, then elements 0+2 and 1+3, then those two
/// (addition commutes, so `hadd`'s operand order gives the same bits).
#[inline(always)]
fn dots8(q: &[f32], k8: &[f32], out: &mut [f32]) {
    let hd = q.len();
    assert!(k8.len() == 8 * hd && out.len() == 8 && hd % 8 == 0);
    // SAFETY: AVX/FMA enabled in every caller; every load reads 8 in-bounds floats
    // (c + 8 <= hd, rows of k8 are hd long: asserted); the store writes out[0..8].
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in (0..hd).step_by(8) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k8.as_ptr().add(r * hd + c)), *a);
            }
        }
        // t[r] = [lo(acc r) + hi(acc r), lo(acc r+4) + hi(acc r+4)]
        let t = |r: usize| {
            let lo = _mm256_permute2f128_ps::<0x20>(acc[r], acc[r + 4]);
            let hi = _mm256_permute2f128_ps::<0x31>(acc[r], acc[r + 4]);
            _mm256_add_ps(lo, hi)
        };
        let (t0, t1, t2, t3) = (t(0), t(1), t(2), t(3));
        // p = [t0_0 + t0_2, t0_1 + t0_3, t1_0 + t1_2, t1_1 + t1_3] per 128-bit lane
        let p = |a: __m256, b: __m256| {
            let (a, b) = (_mm256_castps_pd(a), _mm256_castps_pd(b));
            _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)))
        };
        let s = _mm256_hadd_ps(p(t0, t1), p(t2, t3));
        _mm256_storeu_ps(out.as_mut_ptr(), s);
    }
}

/// out += Σ_j e[j] · v[j] (v: [e.len(), out.len()]), keys in order: per element exactly the
/// FMAs `ops::attend_head` does key by key, with the running sums kept in registers 64 floats at a time.
#[inline(always)]
fn accumulate(out: &mut [f32], e: &[f32], v: &[f32]) {
    let hd = out.len();
    assert!(v.len() == e.len() * hd && hd % 8 == 0);
    for c0 in (0..hd).step_by(64) {
        let w = (hd - c0).min(64) / 8;
        // SAFETY: AVX/FMA enabled in every caller; loads and stores touch out[c0..c0 + 8w] and
        // v[j*hd + c0..j*hd + c0 + 8w], in bounds (c0 + 8w <= hd, j < e.len(): asserted).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            for (i, a) in acc.iter_mut().enumerate().take(w) {
                *a = _mm256_loadu_ps(out.as_ptr().add(c0 + 8 * i));
            }
            for (j, &ej) in e.iter().enumerate() {
                let ev = _mm256_set1_ps(ej);
                let row = v.as_ptr().add(j * hd + c0);
                for (i, a) in acc.iter_mut().enumerate().take(w) {
                    *a = _mm256_fmadd_ps(ev, _mm256_loadu_ps(row.add(8 * i)), *a);
                }
            }
            for (i, a) in acc.iter().enumerate().take(w) {
                _mm256_storeu_ps(out.as_mut_ptr().add(c0 + 8 * i), *a);
            }
        }
    }
}

/// f16 row to f32 (length a multiple of 8).
#[inline(always)]
fn f16_row(src: &[half::f16], dst: &mut [f32]) {
    for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
        // SAFETY: F16C/AVX enabled in every caller; `s` is 8 f16 = 16 bytes, `d` 8 floats.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr() as *const __m128i))) }
    }
}

/// Dot of two f32 rows (length a multiple of 8): the same single FMA chain and final hsum as
/// `dot_f32_f16` (conversion first gives the same values, so the same result).
#[inline(always)]
fn dot8(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: FMA/AVX enabled in every caller.
    let mut acc = unsafe { _mm256_setzero_ps() };
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        // SAFETY: as above.
        acc = unsafe { _mm256_fmadd_ps(load8f(x), load8f(y), acc) };
    }
    hsum(acc)
}


/// GELU (erf form) of every element, four at a time in f64: `ops::gelu`'s formula with the
/// same erf fit, and exp from range reduction plus a degree-11 Taylor series (relative error
/// below 1e-14, far under the f32 rounding of the result; tested against `ops::gelu`). Every
/// element takes the same path (a short tail is padded to four), so results do not depend on
/// the slice's length.
#[target_feature(enable = "avx2,fma")]
pub fn gelu(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(4);
    for c in &mut chunks {
        gelu4(c);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut t = [0f32; 4];
        t[..rest.len()].copy_from_slice(rest);
        gelu4(&mut t);
        let n = rest.len();
        rest.copy_from_slice(&t[..n]);
    }
}

#[inline(always)]
fn gelu4(c: &mut [f32]) {
    assert!(c.len() == 4);
    // SAFETY: AVX2/FMA are enabled in the only caller; the load and store touch c[0..4].
    unsafe {
        let xf = _mm_loadu_ps(c.as_ptr());
        let x = _mm256_cvtps_pd(_mm_mul_ps(xf, _mm_set1_ps(std::f32::consts::FRAC_1_SQRT_2)));
        let one = _mm256_set1_pd(1.0);
        let z = _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
        let t = _mm256_div_pd(one, _mm256_add_pd(one, _mm256_mul_pd(_mm256_set1_pd(0.5), z)));
        let mut p = _mm256_set1_pd(0.17087277);
        for k in [-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196, 1.00002368] {
            p = _mm256_add_pd(_mm256_set1_pd(k), _mm256_mul_pd(t, p));
        }
        let nzz = _mm256_sub_pd(_mm256_setzero_pd(), _mm256_mul_pd(z, z));
        let arg = _mm256_add_pd(_mm256_sub_pd(nzz, _mm256_set1_pd(1.26551223)), _mm256_mul_pd(t, p));
        let r = _mm256_mul_pd(t, exp_pd(arg));
        let pos = _mm256_cmp_pd::<_CMP_GE_OQ>(x, _mm256_setzero_pd());
        let erf = _mm256_blendv_pd(_mm256_sub_pd(r, one), _mm256_sub_pd(one, r), pos);
        let erf = _mm256_cvtpd_ps(erf);
        let g = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(0.5), xf), _mm_add_ps(_mm_set1_ps(1.0), erf));
        _mm_storeu_ps(c.as_mut_ptr(), g);
    }
}

/// e^a for four f64 (a <= ~1 here); 0 below -708 (where e^a underflows).
#[inline(always)]
fn exp_pd(a: __m256d) -> __m256d {
    // SAFETY: AVX2/FMA are enabled in every caller.
    unsafe {
        let k = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(a, _mm256_set1_pd(std::f64::consts::LOG2_E)));
        let k = _mm256_max_pd(k, _mm256_set1_pd(-1022.0));
        // r = a - k·ln2 with ln2 split in two parts (Cody–Waite), |r| <= ~0.35 where it matters
        let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(6.931_471_803_691_238_2e-1), a);
        let r = _mm256_fnmadd_pd(k, _mm256_set1_pd(1.908_214_929_270_587_7e-10), r);
        let mut p = _mm256_set1_pd(1.0 / 39_916_800.0);
        for f in [3_628_800.0, 362_880.0, 40_320.0, 5_040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0] {
            p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(1.0 / f));
        }
        let bits = _mm256_slli_epi64::<52>(_mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(k)), _mm256_set1_epi64x(1023)));
        let e = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
        _mm256_and_pd(e, _mm256_cmp_pd::<_CMP_GE_OQ>(a, _mm256_set1_pd(-708.0)))
    }
}

/// gate = gelu_tanh(gate) · up (GeGLU), eight at a time: `ops::gelu_tanh` in f32 as
/// x / (1 + e^(-2u)) (the same function), e^x from range reduction and a degree-6 polynomial
/// (relative error ~1e-7; tested against `ops::gelu_tanh`). Every element takes the same path (a
/// short tail is padded to eight), so results do not depend on the slice's length.
#[target_feature(enable = "avx2,fma")]
pub fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len());
    let len = gate.len();
    let mut chunks = gate.chunks_exact_mut(8);
    let mut ups = up.chunks_exact(8);
    for (g, u) in (&mut chunks).zip(&mut ups) {
        geglu8(g, u);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let n = rest.len();
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n].copy_from_slice(rest);
        u[..n].copy_from_slice(&up[len - n..len]);
        geglu8(&mut g, &u);
        rest.copy_from_slice(&g[..n]);
    }
}

#[inline(always)]
fn geglu8(g: &mut [f32], u: &[f32]) {
    assert!(g.len() == 8 && u.len() == 8);
    // SAFETY: AVX2/FMA are enabled in the only caller; loads and stores touch g[0..8], u[0..8].
    unsafe {
        let x = _mm256_loadu_ps(g.as_ptr());
        let x2 = _mm256_mul_ps(x, x);
        let inner = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(super::ops::SQRT_2_OVER_PI), x), _mm256_fmadd_ps(_mm256_set1_ps(super::ops::GELU_COEF_A), x2, _mm256_set1_ps(1.0)));
        // 0.5·x·(1 + tanh(u)) = x / (1 + e^(-2u)): no cancellation where tanh(u) is near -1.
        let e = exp8(_mm256_mul_ps(inner, _mm256_set1_ps(-2.0)));
        let gelu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(gelu, _mm256_loadu_ps(u.as_ptr())));
    }
}

/// e^x for eight f32, x clamped to [-88, 88] (so 0 < e^x < ∞): x = k·ln2 + r, e^r by a
/// degree-6 Taylor polynomial (|r| <= ln2/2), times 2^k through the exponent bits.
#[inline(always)]
fn exp8(x: __m256) -> __m256 {
    // SAFETY: AVX2/FMA are enabled in every caller.
    unsafe {
        let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0)), _mm256_set1_ps(88.0));
        let k = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)));
        _mm256_mul_ps(p, _mm256_castsi256_ps(bits))
    }
}
