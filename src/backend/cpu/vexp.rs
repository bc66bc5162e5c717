//! SiLU at the AVX-512 level with `f32::exp`'s bits (x86-64).
//!
//! `ops::silu` calls the C library's `expf`. glibc's (2.28 and later; on a CPU with FMA its
//! `__expf_fma` variant, which x86-64 glibc picks there) computes in double precision with a
//! 32-entry table: `kd = fma(N/ln2, x, SHIFT)` rounds x·N/ln2 to an integer k (its low bits in
//! kd's mantissa), `r = fma(N/ln2, x, -(kd - SHIFT))`, `s = 2^(k/N)` from `T[k % N]` plus k's
//! bits in the exponent, `y = fma(fma(C0, r, C1), r², fma(C2, r, 1))·s`, rounded once to f32.
//! Those are exact IEEE operations in a fixed order, so [`silu_mul`] runs the same sequence on 8
//! doubles per vector and gets the same bits; lanes outside glibc's fast path (|x| ≥ 88, NaN,
//! infinities: its overflow, underflow and special cases) are recomputed with `f32::exp`
//! itself. The tests below compare against `f32::exp` on a sample of every f32 and every 5th
//! float of |x| < 16 (and, `--ignored exp_matches_libm_on_every_float`, all 2^32 bit patterns:
//! passed with glibc 2.36 on AMD Zen 4 and glibc 2.39 on the Xeon) on the machine that runs them.

use std::arch::x86_64::*;

use super::ops;

/// glibc's `__exp2f_data` (sysdeps/ieee754/flt-32/math_config.h): `T[i]` = bits of 2^(i/32)
/// minus `i << 47`, N/ln2, the rounding shift 1.5·2^52, and the polynomial C0..C2 (scaled by N).
const TAB: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b, 0x3fef54873168b9aa,
    0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74,
    0x3feea11473eb0187, 0x3feea589994cce13, 0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];
const INV_LN2_N: u64 = 0x40471547652b82fe;
const SHIFT: u64 = 0x4338000000000000;
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;

/// glibc's fast path takes x with `(bits >> 20) & 0x7ff` at most this (|x| < 88).
const FAST_TOP: i32 = 0x42a;

/// exp of 8 floats widened to doubles: glibc's fast path.
#[inline(always)]
unsafe fn exp8(xd: __m512d) -> __m256 {
    // SAFETY: AVX-512F in every caller; the gather reads `TAB` at indices 0..32.
    unsafe {
        let f = |b: u64| _mm512_set1_pd(f64::from_bits(b));
        let (inv, shift) = (f(INV_LN2_N), f(SHIFT));
        let kds = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kds);
        let kd = _mm512_sub_pd(kds, shift);
        let r = _mm512_fmsub_pd(inv, xd, kd);
        let idx = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let t = _mm512_i64gather_epi64::<8>(idx, TAB.as_ptr() as *const i64);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(f(C0), r, f(C1));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(f(C2), r, _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }
}

/// `f32::exp` of 16 floats.
///
/// # Safety
/// AVX-512F must be enabled in the caller.
#[inline(always)]
pub unsafe fn exp16(x: __m512) -> __m512 {
    // SAFETY: the caller's promise.
    unsafe {
        let lo = exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
        let hi = exp8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)))));
        let e = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi)));
        let top = _mm512_and_si512(_mm512_srli_epi32::<20>(_mm512_castps_si512(x)), _mm512_set1_epi32(0x7ff));
        let slow = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(FAST_TOP));
        if slow == 0 {
            return e;
        }
        let (mut xs, mut es) = ([0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(xs.as_mut_ptr(), x);
        _mm512_storeu_ps(es.as_mut_ptr(), e);
        for (i, (e, x)) in es.iter_mut().zip(xs).enumerate() {
            if (slow >> i) & 1 == 1 {
                *e = x.exp();
            }
        }
        _mm512_loadu_ps(es.as_ptr())
    }
}

/// gate = silu(gate)·up, each element `ops::silu(g) * u`'s bits (x / (1 + exp(-x)), then ·u).
///
/// # Safety
/// AVX-512F must be available (the `Avx512Vnni` level).
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let n16 = n / 16 * 16;
    // SAFETY: AVX-512F enabled here; loads and stores stay below n16 in both slices.
    unsafe {
        let one = _mm512_set1_ps(1.0);
        let sign = _mm512_set1_ps(-0.0);
        for i in (0..n16).step_by(16) {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let e = exp16(_mm512_xor_ps(g, sign));
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(s, _mm512_loadu_ps(up.as_ptr().add(i))));
        }
    }
    for (g, u) in gate[n16..n].iter_mut().zip(&up[n16..n]) {
        *g = ops::silu(*g) * u;
    }
}

/// `f32::exp` of each value (for the tests).
///
/// # Safety
/// AVX-512F must be available.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn exp_slice(x: &mut [f32]) {
    let n16 = x.len() / 16 * 16;
    // SAFETY: AVX-512F enabled here; every access is below n16.
    unsafe {
        for i in (0..n16).step_by(16) {
            _mm512_storeu_ps(x.as_mut_ptr().add(i), exp16(_mm512_loadu_ps(x.as_ptr().add(i))));
        }
    }
    for v in &mut x[n16..] {
        *v = v.exp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::SimdLevel;

    fn avx512() -> bool {
        SimdLevel::Avx512Vnni.supported()
    }

    /// `exp_slice` against `f32::exp` on every `step`-th bit pattern (plus `offset`).
    fn check_bits(step: u64, offset: u64) {
        let mut xs = Vec::with_capacity(1 << 16);
        let mut b = offset;
        let mut bad = 0u64;
        while b < 1 << 32 {
            xs.clear();
            while xs.len() < 1 << 16 && b < 1 << 32 {
                xs.push(f32::from_bits(b as u32));
                b += step;
            }
            let mut ys = xs.clone();
            // SAFETY: checked by `avx512()` in the callers.
            unsafe { exp_slice(&mut ys) };
            for (x, y) in xs.iter().zip(&ys) {
                let want = x.exp();
                if want.to_bits() != y.to_bits() && !(want.is_nan() && y.is_nan()) {
                    bad += 1;
                    assert!(bad < 10, "exp({x:e} = {:#x}): {y:e} vs libm {want:e}", x.to_bits());
                }
            }
        }
        assert_eq!(bad, 0);
    }

    #[test]
    fn exp_matches_libm_on_a_sample_of_every_float() {
        if !avx512() {
            return;
        }
        check_bits(61, 7);
        // every float of SiLU's usual range, |x| < 16, at a finer step
        let (lo, hi) = (0u32, 16f32.to_bits());
        for sign in [0u32, 1 << 31] {
            let xs: Vec<f32> = (lo..hi).step_by(5).map(|b| f32::from_bits(b | sign)).collect();
            let mut ys = xs.clone();
            // SAFETY: checked above.
            unsafe { exp_slice(&mut ys) };
            for (x, y) in xs.iter().zip(&ys) {
                assert_eq!(y.to_bits(), x.exp().to_bits(), "exp({x:e})");
            }
        }
    }

    /// All 2^32 bit patterns (about a minute): `--ignored exp_matches_libm_on_every_float`.
    #[test]
    #[ignore]
    fn exp_matches_libm_on_every_float() {
        if !avx512() {
            return;
        }
        check_bits(1, 0);
    }

    #[test]
    fn silu_mul_equals_reference_bitwise() {
        if !avx512() {
            return;
        }
        for n in [0usize, 1, 15, 16, 17, 100, 1536 * 3 + 5] {
            let g: Vec<f32> = (0..n).map(|i| ((i as f32 * 0.7311).sin() * 12.0) * if i % 97 == 3 { 10.0 } else { 1.0 }).collect();
            let u: Vec<f32> = (0..n).map(|i| (i as f32 * 1.37).cos() * 3.0).collect();
            let mut got = g.clone();
            // SAFETY: checked above.
            unsafe { silu_mul(&mut got, &u) };
            for i in 0..n {
                assert_eq!(got[i].to_bits(), (ops::silu(g[i]) * u[i]).to_bits(), "n {n} i {i} g {}", g[i]);
            }
        }
    }
}
