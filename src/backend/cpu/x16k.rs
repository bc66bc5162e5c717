//! AVX-512 VNNI matmul over Q4_K and Q6_K weights repacked at load 16 rows at a time (x86-64):
//! the K-quant twin of `x16` (read its notes first). Q4_K below; Q6_K at [`BlockQ6Kx16`].
//!
//! Lane r of every vector is row r of a group of 16. Per 32-element sub-block, 8 `vpdpbusd`
//! against broadcast 4-byte groups of a token's Q8_K activations give each row's exact sum,
//! one `vpmulld` by the rows' 6-bit scales adds it to the block's scaled sum; per block, 8
//! `vpdpwssd` of the rows' mins against the token's `bsums` give the min term, then the
//! reference's float formula per row. The current kernel (`avx512_k`) reduces every block of
//! every (row, token) across lanes instead.
//!
//! Per (row, token) the integers are the reference's exact `sum_sc` and `sum_min`, and the float
//! formula `acc += (d_w·d_x)·sum_sc - (dmin_w·d_x)·sum_min` in block order from 0.0 is
//! `quant::dot_q8k_scalar`'s, so results equal it bitwise (tests below).
//!
//! Per 16 rows and block: the nibbles in sub-block order (2048 bytes), scales (128), mins doubled
//! as i16 pair partners (256), d and dmin (64): 2496 bytes against 16 × 144 = 2304 mapped (+8%).

use crate::gguf::types::q4k_scale_min;
use crate::gguf::{GgmlType, QK_K};

use super::x16::{Block16, Packed16, ROWS};

/// One 256-element block of 16 rows.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ4Kx16 {
    /// sub-block j (bytes 256j..256j + 256), vector v (64 bytes), lane r (4 bytes), byte e: row
    /// r's element 4v + e of sub-block j in the low nibble, 16 + 4v + e in the high one
    pub qs: [u8; 2048],
    /// [j][r]: row r's scale of sub-block j
    pub sc: [u8; 128],
    /// [i][r][2]: row r's min of sub-block i, twice (it multiplies bsums 2i and 2i + 1)
    pub mn: [u8; 256],
    /// the rows' f16 `d`
    pub d: [u16; 16],
    /// the rows' f16 `dmin`
    pub dmin: [u16; 16],
}

/// A Q4_K matrix repacked 16 rows at a time.
pub type PackedQ4Kx16 = Packed16<BlockQ4Kx16>;

impl Block16 for BlockQ4Kx16 {
    const TY: GgmlType = GgmlType::Q4K;
    const QB: usize = QK_K;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ4Kx16 { qs: [0; 2048], sc: [0; 128], mn: [0; 256], d: [0; 16], dmin: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            p.d[r] = u16::from_le_bytes([src[0], src[1]]);
            p.dmin[r] = u16::from_le_bytes([src[2], src[3]]);
            let qs = &src[16..144];
            for j in 0..8 {
                let (sc, m) = q4k_scale_min(j, &src[4..16]);
                p.sc[16 * j + r] = sc;
                p.mn[32 * j + 2 * r] = m;
                p.mn[32 * j + 2 * r + 1] = m;
                // element l of sub-block j: qs[32 (j / 2) + l], low nibble for even j
                let nib = |l: usize| {
                    let v = qs[32 * (j / 2) + l];
                    if j % 2 == 0 { v & 0x0F } else { v >> 4 }
                };
                for v in 0..4 {
                    for e in 0..4 {
                        p.qs[256 * j + 64 * v + 4 * r + e] = nib(4 * v + e) | nib(16 + 4 * v + e) << 4;
                    }
                }
            }
        }
        p
    }
}

/// One 256-element Q6_K block of 16 rows: the 6-bit weights whole, one per byte (a tile reuses
/// them without unpacking; 274 bytes per row against 210 mapped, +30%).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ6Kx16 {
    /// unit u of 32 elements (bytes 512u..512u + 512), vector v (64 bytes), lane r (4 bytes),
    /// byte e: row r's element 32u + 4v + e, 0..64 (the weight is q - 32)
    pub q: [u8; 4096],
    /// [g][r]: row r's scale of group g (16 elements)
    pub sc: [i8; 256],
    /// [i][r][2]: row r's scales of groups 2i and 2i + 1 (the pairs `bsums` 2i, 2i + 1 meet)
    pub sc2: [i8; 256],
    /// the rows' f16 `d`
    pub d: [u16; 16],
}

/// A Q6_K matrix repacked 16 rows at a time.
pub type PackedQ6Kx16 = Packed16<BlockQ6Kx16>;

impl Block16 for BlockQ6Kx16 {
    const TY: GgmlType = GgmlType::Q6K;
    const QB: usize = QK_K;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ6Kx16 { q: [0; 4096], sc: [0; 256], sc2: [0; 256], d: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            let q = q6k_values(src);
            for (i, &v) in q.iter().enumerate() {
                let (u, v4, e) = (i / 32, (i % 32) / 4, i % 4);
                p.q[512 * u + 64 * v4 + 4 * r + e] = v;
            }
            for gi in 0..16 {
                p.sc[16 * gi + r] = src[192 + gi] as i8;
                p.sc2[32 * (gi / 2) + 2 * r + gi % 2] = src[192 + gi] as i8;
            }
            p.d[r] = u16::from_le_bytes([src[208], src[209]]);
        }
        p
    }
}

/// The 256 six-bit values (0..64) of a Q6_K block in element order (`quant::dot_q8k_scalar`'s
/// reading: per half, `ql` low nibbles then high nibbles, two bits of `qh` each).
fn q6k_values(wb: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&wb[64 * half..64 * half + 64], &wb[128 + 32 * half..128 + 32 * half + 32]);
        let o = &mut q[128 * half..128 * half + 128];
        for l in 0..32 {
            o[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            o[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            o[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            o[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

#[cfg(target_arch = "x86_64")]
pub use simd::{matmul_rows_q4k, matmul_rows_q6k};
#[cfg(target_arch = "x86_64")]
pub(super) use simd::{q4k_add, q4k_mins};

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{BlockQ4Kx16, BlockQ6Kx16, PackedQ4Kx16, PackedQ6Kx16};
    use crate::backend::cpu::x16::{group_tiles, store16, ROWS};
    use crate::backend::cpu::quant::BlockQ8K;
    use crate::backend::cpu::shared::SharedOut;
    use crate::gguf::QK_K;

    /// Rows `rows` (whole groups of 16) of a repacked Q4_K matrix against `n_tok` Q8_K activation
    /// rows (`acts`: [n_tok, cols / 256]), in token tiles of 8, then 4, then single tokens.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q4k(p: &PackedQ4Kx16, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile, &p.blocks, p.rows, p.cols / QK_K, rows, acts, n_tok, out)
    }

    /// Rows `rows` (whole groups of 16) of a repacked Q6_K matrix against `n_tok` Q8_K activation
    /// rows (`acts`: [n_tok, cols / 256]), in token tiles of 8, then 4, then single tokens.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q6k(p: &PackedQ6Kx16, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile6, &p.blocks, p.rows, p.cols / QK_K, rows, acts, n_tok, out)
    }

    /// Q6_K: per 16-element group, 4 `vpdpbusd` give each row Σ q·x and one `vpmulld` scales
    /// it; 8 `vpdpwssd` of the scales against `bsums` give Σ sc·bsum, and the block's exact sum
    /// is Σ sc·Σ q·x - 32·Σ sc·bsum (the reference's Σ sc·Σ (q - 32)·x); then `(d_w·d_x)·sum`.
    #[inline(always)]
    fn tile6<const NT: usize>(w: &[BlockQ6Kx16], acts: &[BlockQ8K], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8K]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F/BW/VNNI and F16C are enabled in the only caller; every load reads
        // inside a `BlockQ6Kx16` or a `BlockQ8K` (4-byte groups of `qs` and `bsums` read unaligned).
        unsafe {
            let mut acc = [_mm512_setzero_ps(); NT];
            for (b, blk) in w.iter().enumerate() {
                let mut isc = [_mm512_setzero_si512(); NT];
                for u in 0..8 {
                    let qp = blk.q.as_ptr().add(512 * u);
                    let pf = qp.wrapping_add(crate::backend::cpu::shared::PREFETCH_BYTES);
                    for line in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64 * line) as *const i8);
                    }
                    let q: [__m512i; 8] = std::array::from_fn(|v| _mm512_loadu_si512(qp.add(64 * v) as *const __m512i));
                    let sc: [__m512i; 2] = std::array::from_fn(|h| _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.sc.as_ptr().add(16 * (2 * u + h)) as *const __m128i)));
                    for t in 0..NT {
                        let qx = x[t][b].qs.as_ptr().add(32 * u) as *const i32;
                        for h in 0..2 {
                            let mut s = _mm512_setzero_si512();
                            for k in 0..4 {
                                s = _mm512_dpbusd_epi32(s, q[4 * h + k], _mm512_set1_epi32(qx.add(4 * h + k).read_unaligned()));
                            }
                            isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(s, sc[h]));
                        }
                    }
                }
                let sc2: [__m512i; 8] = std::array::from_fn(|i| _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.sc2.as_ptr().add(32 * i) as *const __m256i)));
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.d.as_ptr() as *const __m256i));
                for t in 0..NT {
                    let xb = &x[t][b];
                    let bs = xb.bsums.as_ptr() as *const i32;
                    let mut off = _mm512_setzero_si512();
                    for (i, s2) in sc2.iter().enumerate() {
                        off = _mm512_dpwssd_epi32(off, *s2, _mm512_set1_epi32(bs.add(i).read_unaligned()));
                    }
                    let sum = _mm512_sub_epi32(isc[t], _mm512_slli_epi32::<5>(off));
                    // (d_w·d_x)·sum, added in block order: the reference's rounding
                    let d = _mm512_mul_ps(dw, _mm512_set1_ps(xb.d));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum)));
                }
            }
            for (t, a) in acc.iter().enumerate() {
                store16(out, t0 + t, r0, *a);
            }
        }
    }

    // `inline(always)` kernels, only ever inlined into `matmul_rows_q4k` / `matmul_rows_q6k`, whose
    // features the backend checked at run time before choosing this level.

    /// 16 rows × tokens `t0..t0 + NT`: every sub-block unpacked once for the tile.
    #[inline(always)]
    fn tile<const NT: usize>(w: &[BlockQ4Kx16], acts: &[BlockQ8K], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8K]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F/BW/VNNI and F16C are enabled in the only caller; every load reads
        // inside a `BlockQ4Kx16` or a `BlockQ8K` (4-byte groups of `qs` and `bsums` read unaligned).
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            let mut acc = [_mm512_setzero_ps(); NT];
            for (b, blk) in w.iter().enumerate() {
                let mut isc = [_mm512_setzero_si512(); NT];
                for j in 0..8 {
                    let qs = blk.qs.as_ptr().add(256 * j);
                    let pf = qs.wrapping_add(crate::backend::cpu::shared::PREFETCH_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(pf as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(64) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(128) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(192) as *const i8);
                    let mut q = [_mm512_setzero_si512(); 8];
                    for v in 0..4 {
                        let raw = _mm512_loadu_si512(qs.add(64 * v) as *const __m512i);
                        q[v] = _mm512_and_si512(raw, nib);
                        q[v + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), nib);
                    }
                    let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.sc.as_ptr().add(16 * j) as *const __m128i));
                    for t in 0..NT {
                        let qx = x[t][b].qs.as_ptr().add(32 * j) as *const i32;
                        let mut s = _mm512_setzero_si512();
                        for (k, qk) in q.iter().enumerate() {
                            s = _mm512_dpbusd_epi32(s, *qk, _mm512_set1_epi32(qx.add(k).read_unaligned()));
                        }
                        isc[t] = _mm512_add_epi32(isc[t], _mm512_mullo_epi32(s, sc));
                    }
                }
                let m = q4k_mins(blk);
                for t in 0..NT {
                    acc[t] = q4k_add(acc[t], isc[t], &m, &x[t][b]);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                store16(out, t0 + t, r0, *a);
            }
        }
    }

    /// A Q4_K block's 16 rows' min bytes as i16 (8 vectors of 2 sub-blocks) and their f32 `d`
    /// and `dmin`: what [`q4k_add`] needs besides the scale-weighted sums.
    #[inline(always)]
    pub(in crate::backend::cpu) fn q4k_mins(blk: &BlockQ4Kx16) -> ([__m512i; 8], __m512, __m512) {
        // SAFETY: AVX-512F/BW and F16C are enabled in every caller; the loads read `mn` (8 × 32
        // bytes), `d` and `dmin` (32 bytes each).
        unsafe {
            // a loop, not `array::from_fn`: a closure here would not carry the caller's target
            // features, and its intrinsics would become calls
            let mut mn = [_mm512_setzero_si512(); 8];
            for (i, m) in mn.iter_mut().enumerate() {
                *m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.mn.as_ptr().add(32 * i) as *const __m256i));
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.d.as_ptr() as *const __m256i));
            let dmw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.dmin.as_ptr() as *const __m256i));
            (mn, dw, dmw)
        }
    }

    /// `acc + (d_w·d_x)·isc - (dmin_w·d_x)·Σ min·bsum` for one block of one token (`isc`: the
    /// 16 rows' scale-weighted integer sums): the reference's formula and the one float step of
    /// this kernel and of the AMX one (`amx.rs`), so both give the same bits.
    #[inline(always)]
    pub(in crate::backend::cpu) fn q4k_add(acc: __m512, isc: __m512i, m: &([__m512i; 8], __m512, __m512), xb: &BlockQ8K) -> __m512 {
        let (mn, dw, dmw) = m;
        // SAFETY: AVX-512F/BW/VNNI are enabled in every caller; the loads read `xb.bsums`
        // (16 i16 as 8 i32).
        unsafe {
            let bs = xb.bsums.as_ptr() as *const i32;
            let mut imn = _mm512_setzero_si512();
            for (i, m) in mn.iter().enumerate() {
                imn = _mm512_dpwssd_epi32(imn, *m, _mm512_set1_epi32(bs.add(i).read_unaligned()));
            }
            // (d_w·d_x)·sum_sc - (dmin_w·d_x)·sum_min, added in block order: the reference's
            let xd = _mm512_set1_ps(xb.d);
            let (d, dmin) = (_mm512_mul_ps(*dw, xd), _mm512_mul_ps(*dmw, xd));
            let v = _mm512_sub_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(isc)), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(imn)));
            _mm512_add_ps(acc, v)
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::backend::cpu::quant::{dot_q8k_scalar, quantize_q8k, BlockQ8K};
    use crate::backend::cpu::shared::SharedOut;
    use crate::backend::WeightView;
    use crate::backend::cpu::testutil::{rand_f32, rand_row};
    use crate::backend::cpu::SimdLevel;

    /// Each kernel equals the scalar reference bitwise for every token of every tile size
    /// (13 tokens: 8, 4, 1; 19: 8, 8, 1, 1, 1), one and several blocks per row.
    #[test]
    fn kernels_equal_reference_bitwise() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            for (rows, cols, n_tok) in [(48, 1024, 19), (16, 256, 13), (32, 512, 3)] {
                let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(ty, cols, 500 + r as u64)).collect();
                let w = WeightView::new(ty, rows, cols, &data).expect("view");
                let nb = cols / QK_K;
                let x = rand_f32(9, n_tok * cols);
                let mut q8k = vec![BlockQ8K::default(); n_tok * nb];
                for t in 0..n_tok {
                    quantize_q8k(&x[t * cols..(t + 1) * cols], &mut q8k[t * nb..(t + 1) * nb]);
                }
                let mut o = vec![f32::NAN; n_tok * rows];
                let out = SharedOut::new(&mut o, rows);
                // two calls: the row split must not matter
                for r in [0..16, 16..rows] {
                    // SAFETY: AVX-512 VNNI support was checked above.
                    unsafe {
                        match ty {
                            GgmlType::Q4K => matmul_rows_q4k(&PackedQ4Kx16::new(&w), r, &q8k, n_tok, &out),
                            _ => matmul_rows_q6k(&PackedQ6Kx16::new(&w), r, &q8k, n_tok, &out),
                        }
                    }
                }
                for t in 0..n_tok {
                    for r in 0..rows {
                        let want = dot_q8k_scalar(ty, w.row(r), &q8k[t * nb..(t + 1) * nb]);
                        assert_eq!(o[t * rows + r].to_bits(), want.to_bits(), "{ty:?} {rows}x{cols} token {t} row {r}");
                    }
                }
            }
        }
    }

    /// The Q6_K values as the reference dequantizer reads them.
    #[test]
    fn q6k_values_match_dequantizer() {
        let row = rand_row(GgmlType::Q6K, 256, 77);
        let mut want = vec![0f32; 256];
        crate::gguf::dequantize_row(GgmlType::Q6K, &row, &mut want);
        let d = half::f16::from_le_bytes([row[208], row[209]]).to_f32();
        for (i, &q) in q6k_values(&row).iter().enumerate() {
            let v = d * (row[192 + i / 16] as i8) as f32 * (q as i32 - 32) as f32;
            assert_eq!(v.to_bits(), want[i].to_bits(), "element {i}");
        }
    }
}
