//! AVX-512 VNNI matmul over Q5_0 weights repacked at load 16 rows at a time (x86-64).
//!
//! The mapped GGUF layout keeps a row's blocks together, so a kernel reading it puts four
//! elements of one row in each i32 lane and must scale every lane by its block's two scales:
//! a conversion, two multiplies and an add per 64 products. Repacked ([`PackedQ5x16`]), lane r of
//! every vector belongs to row r of a group of 16, so `vpdpbusd` against one broadcast 4-byte
//! group of a token's activations adds 4 products to each of 16 rows, eight of them cover a
//! 32-element block, and the float work is one block scale per 16 rows × 32 elements: 8 integer
//! instructions + 4 float ones per 512 products, the unpacking shared by a tile of 8 tokens
//! (llama.cpp's CPU "repack" interleaves rows the same way; this layout is ours).
//!
//! Arithmetic per (row, token): each block's exact integer sum, then `acc += (d_w · d_x) · sumi`
//! in block order from 0.0 — the scalar reference's formula (`quant::dot_q8_scalar`), so results
//! equal it bitwise whatever the token tile (tests below), and a token's result does not depend
//! on its batch.
//!
//! The copy is the same size as the Q5_0 tensor (22 bytes per row per block): a Q5_0 block is 2
//! bytes of scale, 4 of fifth bits, 16 of nibbles; here 16 rows' scales (32 bytes), their fifth
//! bits as 8 byte masks (64 bytes) and nibbles (256 bytes) — 352 bytes per 16 rows.

pub use super::blocks::BlockQ8O;
use crate::backend::WeightView;
use crate::gguf::{GgmlType, QK};

/// Rows per group of a repacked matrix.
pub const ROWS: usize = 16;

/// One 32-element block of 16 rows.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ5x16 {
    /// vector j (bytes 64j..64j + 64), lane r (bytes 4r..4r + 4): row r's Q5_0 `qs[4j..4j + 4]`,
    /// i.e. elements 4j + e in the low nibbles and 16 + 4j + e in the high ones (e = 0..4)
    pub qs: [u8; 256],
    /// mask k, bit 4r + e: the fifth bit of row r's element 4k + e (k = 0..8)
    pub qh: [u64; 8],
    /// the 16 rows' f16 scales
    pub d: [u16; 16],
}

/// A block of 16 interleaved rows: what `TY`'s blocks of 16 rows at one block column become.
pub trait Block16: Sized {
    /// The weight type it repacks.
    const TY: GgmlType;
    /// Elements per block.
    const QB: usize;
    /// The 16 rows' source blocks (`TY.block_bytes()` bytes each, row r at `src[r]`), interleaved.
    fn pack(src: [&[u8]; ROWS]) -> Self;
}

/// A matrix whose rows are interleaved 16 at a time, in blocks `B` (the last group padded with
/// zero blocks when the rows are not a multiple of 16; kernels never store the padding rows).
pub struct Packed16<B> {
    /// Rows of the matrix.
    pub rows: usize,
    /// Columns of the matrix.
    pub cols: usize,
    /// [rows.div_ceil(16), cols / B::QB]: group-major
    pub blocks: Vec<B>,
}

impl<B: Block16> Packed16<B> {
    /// Whether `w` can be repacked: type `B::TY`, whole blocks per row.
    pub fn fits(w: &WeightView<'_>) -> bool {
        w.ty == B::TY && w.rows > 0 && w.cols % B::QB == 0
    }

    /// The repacked copy of `w` (see [`Packed16::fits`]).
    pub fn new(w: &WeightView<'_>) -> Self {
        assert!(Self::fits(w), "{:?} x16 repack of a {:?} {}x{} matrix", B::TY, w.ty, w.rows, w.cols);
        let (nb, bb) = (w.cols / B::QB, B::TY.block_bytes());
        let (groups, zero) = (w.rows.div_ceil(ROWS), vec![0u8; bb]);
        let mut blocks = Vec::with_capacity(groups * nb);
        for g in 0..groups {
            for b in 0..nb {
                let src = |r: usize| if g * ROWS + r < w.rows { &w.row(g * ROWS + r)[b * bb..(b + 1) * bb] } else { &zero[..] };
                blocks.push(B::pack(std::array::from_fn(src)));
            }
        }
        Packed16 { rows: w.rows, cols: w.cols, blocks }
    }

    /// Bytes of the copy.
    pub fn bytes(&self) -> usize {
        std::mem::size_of_val(self.blocks.as_slice())
    }
}

/// A Q5_0 matrix repacked 16 rows at a time.
pub type PackedQ5x16 = Packed16<BlockQ5x16>;

impl Block16 for BlockQ5x16 {
    const TY: GgmlType = GgmlType::Q5_0;
    const QB: usize = QK;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ5x16 { qs: [0; 256], qh: [0; 8], d: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            p.d[r] = u16::from_le_bytes([src[0], src[1]]);
            let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]) as u64;
            for j in 0..4 {
                p.qs[64 * j + 4 * r..64 * j + 4 * r + 4].copy_from_slice(&src[6 + 4 * j..6 + 4 * j + 4]);
            }
            for k in 0..8 {
                p.qh[k] |= ((qh >> (4 * k)) & 0xF) << (4 * r);
            }
        }
        p
    }
}

#[cfg(target_arch = "x86_64")]
pub use simd::{matmul_rows_q5_0, quantize_q8o};
#[cfg(target_arch = "x86_64")]
pub(super) use simd::{store16, unpack as unpack_q5};

/// The driver every repacked kernel shares: for each group of 16 rows in `rows` (which starts at
/// a group and ends at one or at the matrix's last row; a last, padded group is computed whole
/// and `store16` writes only its real rows), tokens in tiles
/// of 8, then one of 4, then single tokens; `$tile::<N>(w, acts, nb, t0, r0, out)` writes rows
/// `r0..r0 + 16` of tokens `t0..t0 + N` from the group's blocks `w` (`nb` per row). Every token
/// gets the same instructions in every tile size. A macro, not a function taking the kernels:
/// passed as values, they were called through `Fn::call` shims that were not inlined into the
/// caller's `#[target_feature]` function, so every intrinsic became a call (decode 10x slower).
#[cfg(target_arch = "x86_64")]
macro_rules! group_tiles {
    ($tile:ident, $blocks:expr, $n_rows:expr, $nb:expr, $rows:expr, $acts:expr, $n_tok:expr, $out:expr) => {{
        let (blocks, n_rows, nb, rows, acts, n_tok, out) = ($blocks, $n_rows, $nb, $rows, $acts, $n_tok, $out);
        assert!(rows.start % ROWS == 0 && (rows.end % ROWS == 0 || rows.end == n_rows) && rows.end <= n_rows, "rows {rows:?} of {n_rows}");
        assert!(acts.len() >= n_tok * nb && blocks.len() == n_rows.div_ceil(ROWS) * nb);
        for g in rows.start / ROWS..rows.end.div_ceil(ROWS) {
            let w = &blocks[g * nb..(g + 1) * nb];
            let mut t0 = 0;
            while t0 + 8 <= n_tok {
                $tile::<8>(w, acts, nb, t0, g * ROWS, out);
                t0 += 8;
            }
            if t0 + 4 <= n_tok {
                $tile::<4>(w, acts, nb, t0, g * ROWS, out);
                t0 += 4;
            }
            while t0 < n_tok {
                $tile::<1>(w, acts, nb, t0, g * ROWS, out);
                t0 += 1;
            }
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(super) use group_tiles;

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{BlockQ5x16, BlockQ8O, PackedQ5x16, ROWS};
    use crate::backend::cpu::avx512::quantize_block_sum;
    use crate::backend::cpu::shared::SharedOut;
    use crate::gguf::QK;

    /// Quantizes `x` (length a multiple of 32) into `out` (len x.len() / 32) with exactly
    /// `quant::quantize_q8`'s arithmetic (same `qs`, `d`).
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn quantize_q8o(x: &[f32], out: &mut [BlockQ8O]) {
        for (o, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
            let (b, sum) = quantize_block_sum(xs);
            *o = BlockQ8O { qs: b.qs, d: b.d, off: -16 * sum, s: b.s };
        }
    }

    /// Rows `rows` (whole groups of 16) of a repacked Q5_0 matrix against `n_tok` activation
    /// rows (`acts`: [n_tok, cols / 32]), in token tiles of 8, then 4, then single tokens.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q5_0(p: &PackedQ5x16, rows: std::ops::Range<usize>, acts: &[BlockQ8O], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile, &p.blocks, p.rows, p.cols / QK, rows, acts, n_tok, out)
    }

    /// Stores token t's 16 row results at rows `r0..r0 + 16` (those below the matrix's rows:
    /// a padded last group's real rows).
    #[inline(always)]
    pub(in crate::backend::cpu) fn store16(out: &SharedOut, t: usize, r0: usize, v: __m512) {
        let mut a = [0f32; ROWS];
        // SAFETY: AVX-512F is enabled in every caller (kernels of this level); `a` has 16 floats.
        unsafe { _mm512_storeu_ps(a.as_mut_ptr(), v) };
        if r0 + ROWS <= out.rows() {
            // A whole group: a copy of constant length, inlined (the variable-length one below
            // was a `memmove` call per 16 rows and token: ~0.8% of decode in `perf`).
            out.write_run(t, r0, &a);
        } else {
            out.write_run(t, r0, &a[..out.rows() - r0]);
        }
    }

    // Everything below is `inline(always)` and only ever inlined into `matmul_rows_q5_0`, whose
    // features the backend checked at run time before choosing this level.

    /// 16 rows × tokens `t0..t0 + NT`: every block unpacked once, then per token its integer
    /// sums and the reference's float formula.
    #[inline(always)]
    fn tile<const NT: usize>(w: &[BlockQ5x16], acts: &[BlockQ8O], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8O]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F/BW/VNNI and F16C are enabled in the only caller; every load reads
        // inside a `BlockQ5x16` or a `BlockQ8O` (32 `qs` bytes read as 8 unaligned i32).
        unsafe {
            let mut acc = [_mm512_setzero_ps(); NT];
            for (b, blk) in w.iter().enumerate() {
                prefetch(blk);
                let (q, d) = unpack(blk);
                for t in 0..NT {
                    let a = &x[t][b];
                    let qx = a.qs.as_ptr() as *const i32;
                    let mut s = _mm512_set1_epi32(a.off);
                    for (k, qk) in q.iter().enumerate() {
                        s = _mm512_dpbusd_epi32(s, *qk, _mm512_set1_epi32(qx.add(k).read_unaligned()));
                    }
                    // (d_w · d_x) · sumi, added in block order: the reference's rounding
                    let sc = _mm512_mul_ps(d, _mm512_set1_ps(a.d));
                    acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(s)));
                }
            }
            for (t, a) in acc.iter().enumerate() {
                store16(out, t0 + t, r0, *a);
            }
        }
    }

    /// The block's 16 rows as 8 vectors of u8 weights (vector k, lane r: row r's elements
    /// 4k..4k + 4, the fifth bit added) and their scales as f32.
    #[inline(always)]
    pub(in crate::backend::cpu) fn unpack(blk: &BlockQ5x16) -> ([__m512i; 8], __m512) {
        // SAFETY: AVX-512F/BW and F16C are enabled in the only caller; the loads read `d` (32
        // bytes) and `qs` (4 × 64 bytes).
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.d.as_ptr() as *const __m256i));
            let (nib, sixteen) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(16));
            let mut q = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = _mm512_loadu_si512(blk.qs.as_ptr().add(64 * j) as *const __m512i);
                let lo = _mm512_and_si512(v, nib);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                q[j] = _mm512_mask_add_epi8(lo, blk.qh[j], lo, sixteen);
                q[j + 4] = _mm512_mask_add_epi8(hi, blk.qh[j + 4], hi, sixteen);
            }
            (q, d)
        }
    }

    /// Hints the block 12 blocks ahead (~4 KiB, as `shared::PREFETCH_BYTES`) into L1.
    #[inline(always)]
    fn prefetch(blk: &BlockQ5x16) {
        let p = (blk as *const BlockQ5x16 as *const u8).wrapping_add(12 * std::mem::size_of::<BlockQ5x16>());
        // SAFETY: a prefetch never faults; the address is only computed.
        unsafe {
            for line in 0..6 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line) as *const i8);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::backend::cpu::quant::{dot_q8_scalar, quantize_q8, BlockQ8};
    use crate::backend::cpu::shared::SharedOut;
    use crate::backend::cpu::testutil::{rand_f32, rand_row};
    use crate::backend::cpu::SimdLevel;
    use crate::gguf::dequantize_row;

    fn q5_matrix(rows: usize, cols: usize) -> Vec<u8> {
        (0..rows).flat_map(|r| rand_row(GgmlType::Q5_0, cols, 300 + r as u64)).collect()
    }

    /// The repacked blocks hold exactly the mapped rows' values and scales.
    #[test]
    fn repack_keeps_every_value() {
        let (rows, cols) = (32, 96);
        let data = q5_matrix(rows, cols);
        let w = WeightView::new(GgmlType::Q5_0, rows, cols, &data).expect("view");
        let p = PackedQ5x16::new(&w);
        assert_eq!(p.bytes(), data.len(), "same size as the Q5_0 tensor");
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            dequantize_row(GgmlType::Q5_0, w.row(r), &mut want);
            let (g, l) = (r / ROWS, r % ROWS);
            for c in 0..cols {
                let blk = &p.blocks[g * (cols / QK) + c / QK];
                let e = c % QK;
                let (k, hi) = if e < 16 { (e / 4, false) } else { ((e - 16) / 4, true) };
                let byte = blk.qs[64 * k + 4 * l + e % 4];
                let nib = if hi { byte >> 4 } else { byte & 0xF };
                let bit = (blk.qh[e / 4] >> (4 * l + e % 4)) & 1;
                let d = half::f16::from_bits(blk.d[l]).to_f32();
                let v = d * ((nib as i32 | (bit as i32) << 4) - 16) as f32;
                assert_eq!(v.to_bits(), want[c].to_bits(), "row {r} col {c}");
            }
        }
    }

    /// The kernel equals the scalar reference bitwise for every token of every tile size
    /// (19 tokens: two tiles of 8, then single tokens; 13 tokens: 8, 4, 1), odd block counts too.
    #[test]
    fn kernel_equals_reference_bitwise() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        for (rows, cols, n_tok) in [(48, 640, 19), (16, 96, 13), (32, 32, 5), (37, 64, 9)] {
            let data = q5_matrix(rows, cols);
            let w = WeightView::new(GgmlType::Q5_0, rows, cols, &data).expect("view");
            let p = PackedQ5x16::new(&w);
            let nb = cols / QK;
            let mut x = rand_f32(7, n_tok * cols);
            x[..32].fill(0.0);
            let mut q8 = vec![BlockQ8::default(); n_tok * nb];
            let mut q8o = vec![BlockQ8O::default(); n_tok * nb];
            for t in 0..n_tok {
                quantize_q8(&x[t * cols..(t + 1) * cols], &mut q8[t * nb..(t + 1) * nb]);
                // SAFETY: AVX-512 VNNI support was checked above.
                unsafe { quantize_q8o(&x[t * cols..(t + 1) * cols], &mut q8o[t * nb..(t + 1) * nb]) };
            }
            for (a, b) in q8o.iter().zip(&q8) {
                assert_eq!((a.qs, a.d.to_bits(), a.off, a.s.to_bits()), (b.qs, b.d.to_bits(), -16 * b.qs.iter().map(|&q| q as i32).sum::<i32>(), b.s.to_bits()));
            }
            let mut o = vec![f32::NAN; n_tok * rows];
            let out = SharedOut::new(&mut o, rows);
            // two calls: the row split must not matter
            // SAFETY: AVX-512 VNNI support was checked above.
            unsafe {
                matmul_rows_q5_0(&p, 0..16, &q8o, n_tok, &out);
                matmul_rows_q5_0(&p, 16..rows, &q8o, n_tok, &out);
            }
            for t in 0..n_tok {
                for r in 0..rows {
                    let want = dot_q8_scalar(GgmlType::Q5_0, w.row(r), &q8[t * nb..(t + 1) * nb]);
                    assert_eq!(o[t * rows + r].to_bits(), want.to_bits(), "{rows}x{cols} token {t} row {r}");
                }
            }
        }
    }
}
