//! Token-tiled float matmul: F32 / F16 / BF16 weights × f32 activations (all of the MiniLM
//! embedder's matrices; any float matrix of a GGUF model).
//!
//! The scalar reference is [`quant::dot_float_scalar`] per (row, token). The SIMD kernels (AVX2,
//! AVX-512, chosen at run time) compute a tile of tokens × rows at once: each weight vector is
//! loaded (and converted from f16 / bf16) once per tile instead of once per token, and the
//! tile's activation vectors once per column step.
//!
//! Batch invariance: at a given SIMD level every (row, token) dot product has one reduction
//! order, whatever tile it is computed in — one vector accumulator of `L` lanes fed by FMAs in
//! column order, a fixed horizontal sum, then the columns past the last whole vector in order
//! (scalar multiply-add). Tiles share loads, never accumulators, so a token's result is bitwise
//! the same in a tile of 4, alone (the remainder tiles of 1 token × 8 rows), or on any thread.

use std::ops::Range;

use super::quant::dot_float_scalar;
use super::shared::SharedOut;
use super::SimdLevel;
use crate::backend::WeightView;

/// Tokens per full tile.
pub const TILE_TOKENS: usize = 4;

/// Rows `rows` of the float matrix `w` for `n_tok` activation rows `x` ([n_tok, w.cols]), at `simd`.
pub fn matmul_rows(simd: SimdLevel, w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize, out: &SharedOut) {
    assert!(x.len() >= n_tok * w.cols, "f32mm: x is not [n_tok, cols]");
    assert!(rows.end <= w.rows, "f32mm: rows out of range");
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512Vnni` is only set after detecting avx512f (and avx2, fma, f16c).
        SimdLevel::Avx512Vnni => unsafe { x86::rows_avx512(w, rows, x, n_tok, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only set after detecting avx2, fma and f16c.
        SimdLevel::Avx2 => unsafe { x86::rows_avx2(w, rows, x, n_tok, out) },
        _ => rows_scalar(w, rows, x, n_tok, out),
    }
}

/// The reference: one scalar dot product per (row, token).
pub fn rows_scalar(w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize, out: &SharedOut) {
    let cols = w.cols;
    for t in 0..n_tok {
        for r in rows.clone() {
            out.write(t, r, dot_float_scalar(w.ty, w.row(r), &x[t * cols..(t + 1) * cols]));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use half::{bf16, f16};

    use super::TILE_TOKENS;
    use crate::backend::cpu::shared::{SharedOut, PREFETCH_BYTES};
    use crate::backend::WeightView;
    use crate::gguf::GgmlType;

    // Weight formats as const parameters (folded away in each monomorphized kernel).
    const F32: u8 = 0;
    const F16: u8 = 1;
    const BF16: u8 = 2;

    /// One SIMD width. The methods are `inline(always)` plain functions: they are only ever
    /// inlined into the `#[target_feature]` entry points below, which the backend calls after
    /// run-time detection, so their intrinsics run with the features on.
    trait Simd {
        type V: Copy;
        /// Lanes per vector.
        const L: usize;
        fn zero() -> Self::V;
        /// `L` activations at `p`. Safety: `p..p + L` readable.
        unsafe fn load_x(p: *const f32) -> Self::V;
        /// Weights `i..i + L` of a row of format `W` starting at `p`, as f32. Safety: readable.
        unsafe fn load_w<const W: u8>(p: *const u8, i: usize) -> Self::V;
        fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
        /// The lanes' sum in a fixed order.
        fn hsum(v: Self::V) -> f32;
    }

    struct Avx2;
    struct Avx512;

    impl Simd for Avx2 {
        type V = __m256;
        const L: usize = 8;
        #[inline(always)]
        fn zero() -> __m256 {
            // SAFETY: AVX is enabled in every caller (see the trait).
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load_x(p: *const f32) -> __m256 {
            // SAFETY: the caller guarantees 8 readable floats; loadu has no alignment requirement.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_w<const W: u8>(p: *const u8, i: usize) -> __m256 {
            // SAFETY: the caller guarantees elements i..i+8 readable; unaligned loads; F16C and
            // AVX2 are enabled in every caller.
            unsafe {
                match W {
                    F32 => _mm256_loadu_ps(p.add(4 * i) as *const f32),
                    F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)),
                    _ => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i) as *const __m128i)), 16)),
                }
            }
        }
        #[inline(always)]
        fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            // SAFETY: FMA is enabled in every caller.
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn hsum(v: __m256) -> f32 {
            crate::backend::cpu::avx2::hsum(v)
        }
    }

    impl Simd for Avx512 {
        type V = __m512;
        const L: usize = 16;
        #[inline(always)]
        fn zero() -> __m512 {
            // SAFETY: AVX-512F is enabled in every caller (see the trait).
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load_x(p: *const f32) -> __m512 {
            // SAFETY: the caller guarantees 16 readable floats; loadu has no alignment requirement.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_w<const W: u8>(p: *const u8, i: usize) -> __m512 {
            // SAFETY: the caller guarantees elements i..i+16 readable; unaligned loads.
            unsafe {
                match W {
                    F32 => _mm512_loadu_ps(p.add(4 * i) as *const f32),
                    F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i)),
                    _ => _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(2 * i) as *const __m256i)), 16)),
                }
            }
        }
        #[inline(always)]
        fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            // SAFETY: AVX-512F is enabled in every caller.
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        fn hsum(v: __m512) -> f32 {
            // SAFETY: AVX-512F is enabled in every caller.
            let half = unsafe { _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))) };
            Avx2::hsum(half)
        }
    }

    /// Weight element `i` of a row of format `W` at `p`. Safety: element i readable.
    #[inline(always)]
    unsafe fn weight<const W: u8>(p: *const u8, i: usize) -> f32 {
        // SAFETY: the caller guarantees element i is inside the row; unaligned reads.
        unsafe {
            match W {
                F32 => f32::from_le_bytes(std::ptr::read_unaligned(p.add(4 * i) as *const [u8; 4])),
                F16 => f16::from_le_bytes(std::ptr::read_unaligned(p.add(2 * i) as *const [u8; 2])).to_f32(),
                _ => bf16::from_le_bytes(std::ptr::read_unaligned(p.add(2 * i) as *const [u8; 2])).to_f32(),
            }
        }
    }

    /// Hints the cache line [`PREFETCH_BYTES`] past byte `at` of a weight row: later in the row,
    /// or the rows this chunk reads next (rows are contiguous). Embedding is a stream of weight
    /// reads that the hardware prefetcher alone leaves waiting, as in the quantized kernels.
    #[inline(always)]
    fn prefetch_ahead(row: *const u8, at: usize) {
        // SAFETY: a prefetch neither faults nor reads architecturally; the address (possibly past
        // the end of the mapping) is only computed, never dereferenced. SSE is baseline on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(at + PREFETCH_BYTES) as *const i8) }
    }

    /// Dot products of `R` weight rows × `T` activation rows of `cols` elements, each in the one
    /// order described in the module docs. Safety: every row pointer has `cols` readable elements.
    #[inline(always)]
    unsafe fn tile<S: Simd, const W: u8, const R: usize, const T: usize>(w: [*const u8; R], x: [*const f32; T], cols: usize) -> [[f32; T]; R] {
        let mut acc = [[S::zero(); T]; R];
        let nv = cols / S::L * S::L;
        let mut i = 0;
        while i < nv {
            // SAFETY: i + L <= cols for every row (the caller's guarantee).
            let xv: [S::V; T] = std::array::from_fn(|t| unsafe { S::load_x(x[t].add(i)) });
            for r in 0..R {
                prefetch_ahead(w[r], i * if W == F32 { 4 } else { 2 });
                // SAFETY: as above.
                let wv = unsafe { S::load_w::<W>(w[r], i) };
                for t in 0..T {
                    acc[r][t] = S::fma(wv, xv[t], acc[r][t]);
                }
            }
            i += S::L;
        }
        let mut out = [[0f32; T]; R];
        for r in 0..R {
            for t in 0..T {
                let mut s = S::hsum(acc[r][t]);
                for j in nv..cols {
                    // SAFETY: j < cols.
                    s += unsafe { weight::<W>(w[r], j) * *x[t].add(j) };
                }
                out[r][t] = s;
            }
        }
        out
    }

    /// Tiles of `TILE_TOKENS` tokens × `R4` rows (then single rows), then each remaining token
    /// in tiles of 1 token × `R1` rows (then single rows).
    #[inline(always)]
    fn rows_tiled<S: Simd, const W: u8, const R4: usize, const R1: usize>(w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize, out: &SharedOut) {
        let cols = w.cols;
        assert!(x.len() >= n_tok * cols && rows.end <= w.rows);
        let elem = if W == F32 { 4 } else { 2 };
        assert_eq!(w.row_bytes(), cols * elem, "f32mm: weight rows are not {cols} elements of {elem} bytes");
        let row = |r: usize| w.row(r).as_ptr();
        let xp = |t: usize| x[t * cols..(t + 1) * cols].as_ptr();
        let full = n_tok / TILE_TOKENS * TILE_TOKENS;
        for t0 in (0..full).step_by(TILE_TOKENS) {
            let xs: [*const f32; TILE_TOKENS] = std::array::from_fn(|k| xp(t0 + k));
            let mut r = rows.start;
            while r + R4 <= rows.end {
                // SAFETY: rows r..r+R4 are whole rows of `cols` elements (asserted above), tokens
                // t0..t0+4 whole activation rows.
                let v = unsafe { tile::<S, W, R4, TILE_TOKENS>(std::array::from_fn(|j| row(r + j)), xs, cols) };
                for (j, vr) in v.iter().enumerate() {
                    vr.iter().enumerate().for_each(|(k, &s)| out.write(t0 + k, r + j, s));
                }
                r += R4;
            }
            for r in r..rows.end {
                // SAFETY: as above.
                let v = unsafe { tile::<S, W, 1, TILE_TOKENS>([row(r)], xs, cols) };
                v[0].iter().enumerate().for_each(|(k, &s)| out.write(t0 + k, r, s));
            }
        }
        for t in full..n_tok {
            let xs = [xp(t)];
            let mut r = rows.start;
            while r + R1 <= rows.end {
                // SAFETY: as above.
                let v = unsafe { tile::<S, W, R1, 1>(std::array::from_fn(|j| row(r + j)), xs, cols) };
                v.iter().enumerate().for_each(|(j, vr)| out.write(t, r + j, vr[0]));
                r += R1;
            }
            for r in r..rows.end {
                // SAFETY: as above.
                let v = unsafe { tile::<S, W, 1, 1>([row(r)], xs, cols) };
                out.write(t, r, v[0][0]);
            }
        }
    }

    /// AVX2 + FMA (+ F16C for F16): tiles of 4 tokens × 2 rows (8 accumulators of 16 registers).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn rows_avx2(w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize, out: &SharedOut) {
        match w.ty {
            GgmlType::F32 => rows_tiled::<Avx2, F32, 2, 8>(w, rows, x, n_tok, out),
            GgmlType::F16 => rows_tiled::<Avx2, F16, 2, 8>(w, rows, x, n_tok, out),
            GgmlType::BF16 => rows_tiled::<Avx2, BF16, 2, 8>(w, rows, x, n_tok, out),
            ty => unreachable!("f32mm called for {ty:?}"),
        }
    }

    /// AVX-512F: tiles of 4 tokens × 4 rows (16 accumulators of 32 registers).
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn rows_avx512(w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize, out: &SharedOut) {
        match w.ty {
            GgmlType::F32 => rows_tiled::<Avx512, F32, 4, 8>(w, rows, x, n_tok, out),
            GgmlType::F16 => rows_tiled::<Avx512, F16, 4, 8>(w, rows, x, n_tok, out),
            GgmlType::BF16 => rows_tiled::<Avx512, BF16, 4, 8>(w, rows, x, n_tok, out),
            ty => unreachable!("f32mm called for {ty:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::testutil::{rand_f32, rand_row};
    use crate::gguf::GgmlType;

    const TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

    fn run(simd: SimdLevel, w: WeightView<'_>, rows: Range<usize>, x: &[f32], n_tok: usize) -> Vec<f32> {
        let mut o = vec![0f32; n_tok * w.rows];
        let out = SharedOut::new(&mut o, w.rows);
        matmul_rows(simd, w, rows, x, n_tok, &out);
        o
    }

    /// Shapes with column tails (cols not a multiple of 8 or 16), row counts that leave
    /// remainders after tiles of 2, 4 and 8 rows, and token counts around the tile of 4.
    fn shapes() -> impl Iterator<Item = (usize, usize, usize)> {
        let cols = [1, 7, 16, 33, 384, 389];
        let rows = [1, 3, 13, 37];
        let toks = [1, 2, 4, 5, 9];
        cols.into_iter().flat_map(move |c| rows.into_iter().flat_map(move |r| toks.into_iter().map(move |t| (c, r, t))))
    }

    /// Every level against the scalar reference. Both sum the same `cols` exact-in-f64
    /// products in f32 in different orders; each is within γ(cols) = cols·ε/(1 − cols·ε) of
    /// the exact sum relative to Σ|w·x| (the standard bound on recursive / pairwise
    /// summation), so they differ by at most 2γ(cols)·Σ|w·x|.
    #[test]
    fn every_level_matches_the_scalar_reference_within_the_summation_bound() {
        for ty in TYPES {
            for (cols, n_rows, n_tok) in shapes() {
                let data: Vec<u8> = (0..n_rows).flat_map(|r| rand_row(ty, cols, 7 + r as u64)).collect();
                let w = WeightView::new(ty, n_rows, cols, &data).expect("view");
                let x = rand_f32(cols as u64 * 31 + n_tok as u64, n_tok * cols);
                let reference = run(SimdLevel::Scalar, w, 0..n_rows, &x, n_tok);
                let eps = f32::EPSILON as f64;
                let gamma = cols as f64 * eps / (1.0 - cols as f64 * eps);
                for level in SimdLevel::available() {
                    let got = run(level, w, 0..n_rows, &x, n_tok);
                    for t in 0..n_tok {
                        for r in 0..n_rows {
                            let abs: f64 = decode(ty, w.row(r))
                                .iter().zip(&x[t * cols..(t + 1) * cols]).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                            let (g, e) = (got[t * n_rows + r] as f64, reference[t * n_rows + r] as f64);
                            assert!((g - e).abs() <= 2.0 * gamma * abs + 1e-30, "{ty:?} {level:?} cols {cols} rows {n_rows} tok {n_tok} [{t},{r}]: {g} vs {e} (bound {})", 2.0 * gamma * abs);
                        }
                    }
                }
            }
        }
    }

    /// A weight row as f32.
    fn decode(ty: GgmlType, row: &[u8]) -> Vec<f32> {
        match ty {
            GgmlType::F32 => row.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            GgmlType::F16 => row.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            _ => row.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }

    /// A token's results are bitwise the same computed in a tile of 4, as a remainder token,
    /// alone, or for a sub-range of rows (what a thread's chunk computes).
    #[test]
    fn results_do_not_depend_on_the_tile_or_the_row_range() {
        for ty in TYPES {
            for (cols, n_rows, n_tok) in shapes().filter(|s| s.2 > 1) {
                let data: Vec<u8> = (0..n_rows).flat_map(|r| rand_row(ty, cols, 50 + r as u64)).collect();
                let w = WeightView::new(ty, n_rows, cols, &data).expect("view");
                let x = rand_f32(cols as u64 + 3, n_tok * cols);
                for level in SimdLevel::available() {
                    let batch = run(level, w, 0..n_rows, &x, n_tok);
                    for t in 0..n_tok {
                        let one = run(level, w, 0..n_rows, &x[t * cols..(t + 1) * cols], 1);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&one), bits(&batch[t * n_rows..(t + 1) * n_rows]), "{ty:?} {level:?} cols {cols}: token {t} of {n_tok}");
                    }
                    let split = n_rows / 2 + 1;
                    let mut parts = run(level, w, 0..split.min(n_rows), &x, n_tok);
                    let rest = run(level, w, split.min(n_rows)..n_rows, &x, n_tok);
                    for t in 0..n_tok {
                        for r in split.min(n_rows)..n_rows {
                            parts[t * n_rows + r] = rest[t * n_rows + r];
                        }
                    }
                    assert!(parts.iter().zip(&batch).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?} {level:?}: row split changed results");
                }
            }
        }
    }
}
