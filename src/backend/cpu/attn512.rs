//! Attention at the AVX-512 level: the query heads sharing one KV head against a range of keys,
//! 16 f32 lanes per instruction, with a vector `exp` instead of libm's.
//!
//! Same arithmetic as `avx2::attend_range` (and the shape of `ops::attend_head`, the reference):
//! tiles of `ops::ATT_TILE` keys at absolute positions, online softmax per tile, keys in
//! position order, every query head on its own. Each score is bitwise the AVX2 kernel's (one
//! 8-lane FMA chain per key, two keys per 16-lane register, then `avx2::hsum`'s additions done
//! for 16 keys at once), the softmax sum is added key by key as there, and the values are
//! accumulated with the same FMA per element and key. Only the exponential differs ([`exp16`],
//! within 2 ulp of libm's on the range softmax uses), so results match the scalar reference
//! within the tolerance `cpu::tests` states, and never depend on the batch: a query's
//! arithmetic is a function of its own position, keys and values only.
//!
//! Per key and KV head (head_dim 64, 3 query heads): 4 conversions of K and of V, 12 FMAs for
//! the scores, 12 for the values, ~3 instructions of reduction per score and ~1 of exp: about a
//! quarter of the AVX2 kernel's instructions.

use std::arch::x86_64::*;

use half::f16;

use super::ops::ATT_TILE;

/// Most query heads sharing one KV head that [`attend_range`] takes (as `avx2::MAX_GROUP`).
pub const MAX_GROUP: usize = 8;

/// Whether [`attend_range`] takes heads of `hd` dimensions in groups of `g`.
pub fn supports(hd: usize, g: usize) -> bool {
    hd % 16 == 0 && hd <= 256 && (1..=MAX_GROUP).contains(&g)
}

/// Keys converted from f16 at a time into the f32 tile.
const SUB: usize = 32;

/// Attention of `g` query heads (`q`: [g, hd]) sharing one KV head over the keys `range` (its
/// start a multiple of `ops::ATT_TILE`; `keys`, `vals`: [>= range.end, hd] f16 rows). Without
/// `ml` the normalized output goes to `out` ([g, hd]); with `ml` ([g, 2]) `out` is left
/// unnormalized and each head's running max and sum go to `ml[2h]`, `ml[2h + 1]` for the segment
/// merge in `CpuBackend::attention`.
///
/// # Safety
/// The CPU must have avx512f (the `Avx512Vnni` level checks it) and [`supports`]`(hd, g)`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_range(q: &[f32], keys: &[f16], vals: &[f16], range: std::ops::Range<usize>, hd: usize, scale: f32, out: &mut [f32], ml: Option<&mut [f32]>) {
    const T: usize = ATT_TILE;
    let g = q.len() / hd;
    let n_keys = range.end;
    assert!(supports(hd, g) && out.len() == q.len());
    assert!(keys.len() >= n_keys * hd && vals.len() >= n_keys * hd && range.start % T == 0);
    let mut scores = [[0f32; T]; MAX_GROUP];
    let mut m = [f32::NEG_INFINITY; MAX_GROUP];
    let mut l = [0f32; MAX_GROUP];
    // Zeroed once: lanes past the last key of a short sub-tile read finite values, never NaN.
    let mut tile = [0f32; SUB * 256];
    // Each query head's 8-float chunks, duplicated into both halves of a register.
    let mut qq = [_mm512_setzero_ps(); MAX_GROUP * 32];
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        for (c, x) in qh.chunks_exact(8).enumerate() {
            let v = _mm256_loadu_ps(x.as_ptr());
            qq[h * 32 + c] = dup8(v);
        }
    }
    out.fill(0.0);
    let scale_v = _mm512_set1_ps(scale);
    let mut start = range.start;
    while start < n_keys {
        let end = (start + T).min(n_keys);
        let mut tile_max = [_mm512_set1_ps(f32::NEG_INFINITY); MAX_GROUP];
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            f16_pairs(&keys[s0 * hd..(s0 + n) * hd], hd, &mut tile);
            for (h, tm) in tile_max.iter_mut().enumerate().take(g) {
                let qh = &qq[h * 32..h * 32 + hd / 8];
                for j in (0..n).step_by(16) {
                    let valid = (n - j).min(16);
                    // SAFETY: the tile holds SUB keys of hd (j + 16 <= SUB); scores[h] has T >= s0 - start + j + 16.
                    let s = _mm512_mul_ps(dots16(qh, &tile[j * hd..(j + 16) * hd]), scale_v);
                    let mask: __mmask16 = if valid == 16 { 0xffff } else { (1u16 << valid) - 1 };
                    let s = _mm512_mask_blend_ps(mask, _mm512_set1_ps(f32::NEG_INFINITY), s);
                    _mm512_storeu_ps(scores[h].as_mut_ptr().add(s0 - start + j), s);
                    *tm = _mm512_max_ps(*tm, s);
                }
            }
        }
        let mut m_tile = [0f32; MAX_GROUP];
        for h in 0..g {
            let m_new = m[h].max(_mm512_reduce_max_ps(tile_max[h]));
            let corr = (m[h] - m_new).exp();
            l[h] *= corr;
            for o in out[h * hd..(h + 1) * hd].iter_mut() {
                *o *= corr;
            }
            m[h] = m_new;
            m_tile[h] = m_new;
        }
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            f16_rows(&vals[s0 * hd..(s0 + n) * hd], &mut tile[..n * hd]);
            for h in 0..g {
                let mut e = [0f32; SUB];
                let mv = _mm512_set1_ps(m_tile[h]);
                for j in (0..n).step_by(16) {
                    let valid = (n - j).min(16);
                    let mask: __mmask16 = if valid == 16 { 0xffff } else { (1u16 << valid) - 1 };
                    let s = _mm512_loadu_ps(scores[h].as_ptr().add(s0 - start + j));
                    // Lanes past the last key: e = 0 exactly (exp16 clamps, so mask instead).
                    let ev = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(s, mv)));
                    _mm512_storeu_ps(e.as_mut_ptr().add(j), ev);
                }
                // Key by key, as the AVX2 kernel and the reference add them.
                for &ej in &e[..n] {
                    l[h] += ej;
                }
                accumulate(&mut out[h * hd..(h + 1) * hd], &e[..n], &tile[..n * hd]);
            }
        }
        start = end;
    }
    let lsum = l;
    if let Some(ml) = ml {
        for h in 0..g {
            ml[2 * h] = m[h];
            ml[2 * h + 1] = lsum[h];
        }
        return;
    }
    for h in 0..g {
        let inv = if lsum[h] > 0.0 { 1.0 / lsum[h] } else { 0.0 };
        for o in out[h * hd..(h + 1) * hd].iter_mut() {
            *o *= inv;
        }
    }
}

/// f16 rows to f32 (length a multiple of 16).
#[inline(always)]
fn f16_rows(src: &[f16], dst: &mut [f32]) {
    assert!(src.len() == dst.len() && src.len() % 16 == 0);
    for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        // SAFETY: AVX-512F enabled in every caller; `s` is 16 f16 = 32 bytes, `d` 16 floats.
        unsafe { _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i))) }
    }
}

/// [v, v]: an 8-float register in both halves of a 16-float one.
#[inline(always)]
fn dup8(v: __m256) -> __m512 {
    // SAFETY: AVX-512F enabled in every caller.
    unsafe { _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(v)), _mm256_castps_pd(v))) }
}

/// f16 key rows ([n, hd], n <= SUB) to f32 in pairs: keys 2p and 2p + 1 share 16-float
/// registers, chunk c (dims 8c..8c + 8) of pair p at floats `(p * hd / 8 + c) * 16`: key 2p in
/// the low 8, key 2p + 1 in the high 8 (zeros past an odd last key).
#[inline(always)]
fn f16_pairs(src: &[f16], hd: usize, dst: &mut [f32]) {
    let n = src.len() / hd;
    assert!(src.len() == n * hd && hd % 8 == 0 && dst.len() >= n.div_ceil(2) * 2 * hd);
    for p in 0..n.div_ceil(2) {
        let a = &src[2 * p * hd..(2 * p + 1) * hd];
        let b = if 2 * p + 1 < n { Some(&src[(2 * p + 1) * hd..(2 * p + 2) * hd]) } else { None };
        for c in 0..hd / 8 {
            // SAFETY: F16C/AVX-512F enabled in every caller; each load reads 8 f16 of a row of hd
            // (8c + 8 <= hd), the store 16 floats at (p * hd / 8 + c) * 16 + 16 <= dst.len().
            unsafe {
                let lo = _mm_loadu_si128(a.as_ptr().add(8 * c) as *const __m128i);
                let hi = match b {
                    Some(b) => _mm_loadu_si128(b.as_ptr().add(8 * c) as *const __m128i),
                    None => _mm_setzero_si128(),
                };
                let v = _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
                _mm512_storeu_ps(dst.as_mut_ptr().add((p * hd / 8 + c) * 16), v);
            }
        }
    }
}

/// Scores of a query (`qq`: its hd/8 chunks, each duplicated in both register halves) against
/// 16 keys in the pair layout of [`f16_pairs`] (`k16`: [16 * hd] floats). Per key the FMA chain
/// of `avx2::dot8` (8 lanes, chunks in order), then `avx2::hsum`'s additions (lane i + lane
/// i + 4, then 0 + 2 and 1 + 3, then those two) for all 16 keys at once: every lane of the
/// result is bitwise the AVX2 kernel's score. Lane j holds key j's.
#[inline(always)]
fn dots16(qq: &[__m512], k16: &[f32]) -> __m512 {
    let c8 = qq.len();
    assert!(k16.len() == 16 * 8 * c8);
    // SAFETY: AVX-512F enabled in every caller; pair p's chunk c is 16 floats at (p * c8 + c) * 16
    // < k16.len() (asserted).
    unsafe {
        let mut a = [_mm512_setzero_ps(); 8];
        for (c, &qv) in qq.iter().enumerate() {
            for (p, acc) in a.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k16.as_ptr().add((p * c8 + c) * 16)), *acc);
            }
        }
        // w_m quarter j = key 4m + j, lanes i + (i + 4) of its chain (a[2m] holds keys 4m, 4m + 1).
        let w: [__m512; 4] = std::array::from_fn(|m| {
            let (x, y) = (a[2 * m], a[2 * m + 1]);
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y))
        });
        // z_n quarter j = [key 8n + j: 0 + 2, 1 + 3 | key 8n + 4 + j: 0 + 2, 1 + 3].
        let z: [__m512; 2] = std::array::from_fn(|n| {
            let (x, y) = (w[2 * n], w[2 * n + 1]);
            _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y))
        });
        // Lane 4j + i = key 4i + j: (0 + 2) + (1 + 3).
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]));
        // Back to key order: key k sits in lane 4(k % 4) + k / 4.
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r)
    }
}

/// out += Σ_j e[j] · v[j] (v: [e.len(), out.len()]), keys in order: one FMA per element and
/// key, the running sums in registers 128 floats at a time.
#[inline(always)]
fn accumulate(out: &mut [f32], e: &[f32], v: &[f32]) {
    let hd = out.len();
    assert!(v.len() == e.len() * hd && hd % 16 == 0);
    for c0 in (0..hd).step_by(128) {
        let w = (hd - c0).min(128) / 16;
        // SAFETY: AVX-512F enabled in every caller; loads and stores touch out[c0..c0 + 16w] and
        // v[j*hd + c0..j*hd + c0 + 16w], in bounds (c0 + 16w <= hd, j < e.len(): asserted).
        unsafe {
            let mut acc = [_mm512_setzero_ps(); 8];
            for (i, a) in acc.iter_mut().enumerate().take(w) {
                *a = _mm512_loadu_ps(out.as_ptr().add(c0 + 16 * i));
            }
            for (j, &ej) in e.iter().enumerate() {
                let ev = _mm512_set1_ps(ej);
                let row = v.as_ptr().add(j * hd + c0);
                for (i, a) in acc.iter_mut().enumerate().take(w) {
                    *a = _mm512_fmadd_ps(ev, _mm512_loadu_ps(row.add(16 * i)), *a);
                }
            }
            for (i, a) in acc.iter().enumerate().take(w) {
                _mm512_storeu_ps(out.as_mut_ptr().add(c0 + 16 * i), *a);
            }
        }
    }
}

/// e^x for 16 f32, x clamped to [-88, 88]: x = k·ln2 + r (ln2 split in two for an exact
/// product), e^r by a degree-7 Taylor polynomial (|r| <= ln2/2, truncation < 1e-8 relative),
/// times 2^k through the exponent bits.
#[inline(always)]
pub(super) fn exp16(x: __m512) -> __m512 {
    // SAFETY: AVX-512F is enabled in every caller.
    unsafe {
        let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0)), _mm512_set1_ps(88.0));
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)));
        _mm512_mul_ps(p, _mm512_castsi512_ps(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simd::SimdLevel;

    #[test]
    fn exp16_is_within_2ulp_of_libm_on_softmax_range() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let xs: [f32; 16] = std::array::from_fn(|i| x - i as f32 * 1e-3);
            let mut got = [0f32; 16];
            // SAFETY: avx512f checked above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(xs.as_ptr()))) };
            for (g, v) in got.iter().zip(xs) {
                let want = v.exp();
                worst = worst.max((g - want).abs() / want);
            }
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
    }

    #[test]
    fn dots16_equals_the_avx2_dot_of_each_key_bitwise() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        let hd = 48;
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f16> = (0..16 * hd).map(|i| f16::from_f32(((i * 7 % 23) as f32 - 11.0) * 0.1)).collect();
        let mut tile = vec![0f32; 16 * hd];
        let mut got = [0f32; 16];
        // SAFETY: avx512f (and so avx2, fma, f16c on every CPU with it) checked above.
        unsafe {
            let qq: Vec<__m512> = q.chunks_exact(8).map(|x| dup8(_mm256_loadu_ps(x.as_ptr()))).collect();
            f16_pairs(&k, hd, &mut tile);
            _mm512_storeu_ps(got.as_mut_ptr(), dots16(&qq, &tile));
        }
        for (j, g) in got.iter().enumerate() {
            // `avx2::dot8` in scalar form: 8 lane chains of exact FMAs over the chunks in order,
            // then hsum's additions.
            let mut v = [0f32; 8];
            for c in 0..hd / 8 {
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = q[8 * c + i].mul_add(k[j * hd + 8 * c + i].to_f32(), *vi);
                }
            }
            let y: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
            let want = (y[0] + y[2]) + (y[1] + y[3]);
            assert_eq!(g.to_bits(), want.to_bits(), "key {j}: {g} vs {want}");
        }
    }
}
