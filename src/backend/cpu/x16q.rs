//! AVX-512 VNNI matmul over the legacy 32-element types Q4_0, Q4_1 and Q8_0 repacked at load 16
//! rows at a time (x86-64): the twins of `x16`'s Q5_0 (read its notes first). SmolLM2-135M is
//! Q4_1 with a Q8_0 output head; the synthetic 1.1B is Q4_0.
//!
//! Lane r of every vector is row r of a group of 16, so 8 `vpdpbusd` against broadcast 4-byte
//! groups of a token's activations give the 16 rows' exact integer block sums; the unsigned
//! weights' offsets come from the activation's `off` (-16·Σx): Q4_0's weights are u - 8, so the
//! sum starts at `off / 2`; Q8_0's are stored as w + 128 (u8), so it starts at `8 · off`; Q4_1's
//! are u with a separate min term. Then the scalar reference's float formula in block order from
//! 0.0 (`quant::dot_q8_scalar`): `acc += (d_w·d_x)·sumi` (Q4_0, Q8_0), and for Q4_1 two fused
//! sums `acc = fma(d_w·d_x, sumi, acc)`, `acc_m = fma(m_w, s_x, acc_m)`, then `acc + acc_m`, so results equal it bitwise whatever the token tile
//! (tests below), and a token's result does not depend on its batch.
//!
//! Each copy is exactly the size of its tensor (rows rounded up to 16): per 16 rows and block,
//! Q4_0 288 bytes (16 × 18), Q4_1 320 (16 × 20), Q8_0 544 (16 × 34).
//!
//! The `unpack_*` functions give a block's 16 rows as 8 vectors (vector k, lane r: row r's
//! elements 4k..4k + 4 as u8) plus its scales: the operand a tile kernel of another unit reuses.

use super::x16::{Block16, Packed16, ROWS};
use crate::gguf::{GgmlType, QK};

/// One 32-element Q4_0 block of 16 rows.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ40x16 {
    /// vector j (bytes 64j..64j + 64), lane r (bytes 4r..4r + 4): row r's Q4_0 `qs[4j..4j + 4]`,
    /// i.e. elements 4j + e in the low nibbles and 16 + 4j + e in the high ones (weights u - 8)
    pub qs: [u8; 256],
    /// the 16 rows' f16 scales
    pub d: [u16; 16],
}

/// One 32-element Q4_1 block of 16 rows.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ41x16 {
    /// as [`BlockQ40x16::qs`] (weights u, no offset)
    pub qs: [u8; 256],
    /// the 16 rows' f16 scales `d`
    pub d: [u16; 16],
    /// the 16 rows' f16 mins `m` (element = d·u + m)
    pub m: [u16; 16],
}

/// One 32-element Q8_0 block of 16 rows.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct BlockQ80x16 {
    /// vector k (bytes 64k..64k + 64), lane r (bytes 4r..4r + 4): row r's elements 4k..4k + 4,
    /// each stored as w + 128 (the i8 weight with its sign bit flipped, as u8)
    pub qs: [u8; 512],
    /// the 16 rows' f16 scales
    pub d: [u16; 16],
}

/// A Q4_0 matrix repacked 16 rows at a time.
pub type PackedQ40x16 = Packed16<BlockQ40x16>;
/// A Q4_1 matrix repacked 16 rows at a time.
pub type PackedQ41x16 = Packed16<BlockQ41x16>;
/// A Q8_0 matrix repacked 16 rows at a time.
pub type PackedQ80x16 = Packed16<BlockQ80x16>;

/// Row r's 16 nibble bytes `qs` into `dst`'s lane r (the `x16` Q5_0 layout).
fn put_nibbles(dst: &mut [u8; 256], r: usize, qs: &[u8]) {
    for j in 0..4 {
        dst[64 * j + 4 * r..64 * j + 4 * r + 4].copy_from_slice(&qs[4 * j..4 * j + 4]);
    }
}

impl Block16 for BlockQ40x16 {
    const TY: GgmlType = GgmlType::Q4_0;
    const QB: usize = QK;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ40x16 { qs: [0; 256], d: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            p.d[r] = u16::from_le_bytes([src[0], src[1]]);
            put_nibbles(&mut p.qs, r, &src[2..18]);
        }
        p
    }
}

impl Block16 for BlockQ41x16 {
    const TY: GgmlType = GgmlType::Q4_1;
    const QB: usize = QK;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ41x16 { qs: [0; 256], d: [0; 16], m: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            p.d[r] = u16::from_le_bytes([src[0], src[1]]);
            p.m[r] = u16::from_le_bytes([src[2], src[3]]);
            put_nibbles(&mut p.qs, r, &src[4..20]);
        }
        p
    }
}

impl Block16 for BlockQ80x16 {
    const TY: GgmlType = GgmlType::Q8_0;
    const QB: usize = QK;

    fn pack(src: [&[u8]; ROWS]) -> Self {
        let mut p = BlockQ80x16 { qs: [0; 512], d: [0; 16] };
        for (r, src) in src.into_iter().enumerate() {
            p.d[r] = u16::from_le_bytes([src[0], src[1]]);
            for k in 0..8 {
                for e in 0..4 {
                    p.qs[64 * k + 4 * r + e] = src[2 + 4 * k + e] ^ 0x80;
                }
            }
        }
        p
    }
}

#[cfg(target_arch = "x86_64")]
pub use simd::{matmul_rows_q4_0, matmul_rows_q4_1, matmul_rows_q8_0};
#[cfg(target_arch = "x86_64")]
pub(super) use simd::{add, q4_1_dot, q4_1_min, scaled, unpack_q4_0, unpack_q4_1};

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{BlockQ40x16, BlockQ41x16, BlockQ80x16, PackedQ40x16, PackedQ41x16, PackedQ80x16};
    use crate::backend::cpu::blocks::BlockQ8O;
    use crate::backend::cpu::shared::SharedOut;
    use crate::backend::cpu::x16::{group_tiles, store16, ROWS};
    use crate::gguf::QK;

    /// Rows `rows` (whole groups of 16, or ending at the last row) of a repacked Q4_0 matrix
    /// against `n_tok` activation rows (`acts`: [n_tok, cols / 32]), in token tiles of 8, 4, 1.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q4_0(p: &PackedQ40x16, rows: std::ops::Range<usize>, acts: &[BlockQ8O], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile_q4_0, &p.blocks, p.rows, p.cols / QK, rows, acts, n_tok, out)
    }

    /// As [`matmul_rows_q4_0`], for a repacked Q4_1 matrix.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q4_1(p: &PackedQ41x16, rows: std::ops::Range<usize>, acts: &[BlockQ8O], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile_q4_1, &p.blocks, p.rows, p.cols / QK, rows, acts, n_tok, out)
    }

    /// As [`matmul_rows_q4_0`], for a repacked Q8_0 matrix.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub fn matmul_rows_q8_0(p: &PackedQ80x16, rows: std::ops::Range<usize>, acts: &[BlockQ8O], n_tok: usize, out: &SharedOut) {
        group_tiles!(tile_q8_0, &p.blocks, p.rows, p.cols / QK, rows, acts, n_tok, out)
    }

    // Everything below is `inline(always)` and only ever inlined into the `matmul_rows_*` above,
    // whose features the backend checked at run time before choosing this level.

    /// The 16 rows' exact integer block sums against token activation `a`: `s0` (the offset
    /// term, per type) plus Σ u·x over the 8 weight vectors `q`.
    #[inline(always)]
    fn block_sum(q: &[__m512i; 8], a: &BlockQ8O, s0: i32) -> __m512i {
        let qx = a.qs.as_ptr() as *const i32;
        // SAFETY: AVX-512F/VNNI are enabled in the only callers; the 8 unaligned i32 reads are
        // the 32 bytes of `a.qs`.
        unsafe {
            let mut s = _mm512_set1_epi32(s0);
            for (k, qk) in q.iter().enumerate() {
                s = _mm512_dpbusd_epi32(s, *qk, _mm512_set1_epi32(qx.add(k).read_unaligned()));
            }
            s
        }
    }

    /// 16 f16 values as f32.
    #[inline(always)]
    fn halfs(h: &[u16; 16]) -> __m512 {
        // SAFETY: AVX-512F and F16C are enabled in the only callers; the load reads `h` (32 bytes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i)) }
    }

    /// 4 × 64 nibble bytes as 8 vectors of u4 weights (low nibbles: vectors 0..4, high: 4..8).
    #[inline(always)]
    fn nibbles(qs: &[u8; 256]) -> [__m512i; 8] {
        // SAFETY: AVX-512F/BW are enabled in the only callers; the loads read `qs` (4 × 64 bytes).
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            let mut q = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let v = _mm512_loadu_si512(qs.as_ptr().add(64 * j) as *const __m512i);
                q[j] = _mm512_and_si512(v, nib);
                q[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            }
            q
        }
    }

    /// A Q4_0 block's 16 rows as 8 vectors of u8 weights u (the weight is u - 8) and their scales.
    #[inline(always)]
    pub fn unpack_q4_0(blk: &BlockQ40x16) -> ([__m512i; 8], __m512) {
        (nibbles(&blk.qs), halfs(&blk.d))
    }

    /// A Q4_1 block's 16 rows as 8 vectors of u8 weights u, their scales `d` and mins `m`.
    #[inline(always)]
    pub fn unpack_q4_1(blk: &BlockQ41x16) -> ([__m512i; 8], __m512, __m512) {
        (nibbles(&blk.qs), halfs(&blk.d), halfs(&blk.m))
    }

    /// A Q8_0 block's 16 rows as 8 vectors of u8 weights w + 128 and their scales.
    #[inline(always)]
    pub fn unpack_q8_0(blk: &BlockQ80x16) -> ([__m512i; 8], __m512) {
        // SAFETY: AVX-512F is enabled in the only callers; the loads read `qs` (8 × 64 bytes).
        let q = std::array::from_fn(|k| unsafe { _mm512_loadu_si512(blk.qs.as_ptr().add(64 * k) as *const __m512i) });
        (q, halfs(&blk.d))
    }

    /// Hints `lines` cache lines `shared::PREFETCH_BYTES` past `p` into L1.
    #[inline(always)]
    fn prefetch(p: *const u8, lines: usize) {
        let p = p.wrapping_add(crate::backend::cpu::shared::PREFETCH_BYTES);
        for line in 0..lines {
            // SAFETY: a prefetch never faults; the address is only computed.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line) as *const i8) };
        }
    }

    // The float steps below are shared with the AMX kernels (`amx.rs`), so both give the same
    // bits by construction; their callers are `target_feature(avx512f, ...)` kernels only.

    /// The rows' (d_w·d_x)·sumi for one token, the reference's rounding.
    #[inline(always)]
    pub fn scaled(d: __m512, a: &BlockQ8O, s: __m512i) -> __m512 {
        // SAFETY: AVX-512F is enabled in the only callers.
        unsafe { _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(a.d)), _mm512_cvtepi32_ps(s)) }
    }

    /// Adds `v` to a token's accumulator (blocks in order, from 0.0).
    #[inline(always)]
    pub fn add(acc: &mut __m512, v: __m512) {
        // SAFETY: AVX-512F is enabled in the only callers.
        *acc = unsafe { _mm512_add_ps(*acc, v) };
    }

    /// Q4_1's step for one token and block: `acc = fma(d_w·d_x, sumi, acc)`,
    /// `acc_m = fma(m_w, s_x, acc_m)` (the row's result is `acc + acc_m` after the last block).
    #[inline(always)]
    pub fn q4_1_add(acc: &mut __m512, acc_m: &mut __m512, d: __m512, m: __m512, a: &BlockQ8O, s: __m512i) {
        q4_1_min(acc_m, m, a);
        q4_1_dot(acc, d, a, s);
    }

    /// Q4_1's min step: `acc_m = fma(m_w, s_x, acc_m)`.
    #[inline(always)]
    pub fn q4_1_min(acc_m: &mut __m512, m: __m512, a: &BlockQ8O) {
        // SAFETY: AVX-512F is enabled in the only callers.
        *acc_m = unsafe { _mm512_fmadd_ps(m, _mm512_set1_ps(a.s), *acc_m) };
    }

    /// Q4_1's scale step: `acc = fma(d_w·d_x, sumi, acc)`.
    #[inline(always)]
    pub fn q4_1_dot(acc: &mut __m512, d: __m512, a: &BlockQ8O, s: __m512i) {
        // SAFETY: AVX-512F is enabled in the only callers.
        *acc = unsafe { _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a.d)), _mm512_cvtepi32_ps(s), *acc) };
    }

    /// Q4_0, 16 rows × tokens `t0..t0 + NT`: each block unpacked once for the tile; per token
    /// sumi = Σ u·x - 8·Σ x, then `acc += (d_w·d_x)·sumi`.
    #[inline(always)]
    fn tile_q4_0<const NT: usize>(w: &[BlockQ40x16], acts: &[BlockQ8O], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8O]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F is enabled in the only caller.
        let mut acc = [unsafe { _mm512_setzero_ps() }; NT];
        for (b, blk) in w.iter().enumerate() {
            prefetch(blk.qs.as_ptr(), 5);
            let (q, d) = unpack_q4_0(blk);
            for t in 0..NT {
                let a = &x[t][b];
                add(&mut acc[t], scaled(d, a, block_sum(&q, a, a.off >> 1)));
            }
        }
        for (t, a) in acc.iter().enumerate() {
            store16(out, t0 + t, r0, *a);
        }
    }

    /// Q4_1: per token sumi = Σ u·x, then `acc = fma(d_w·d_x, sumi, acc)` and
    /// `acc_m = fma(m_w, s_x, acc_m)` in block order, the row's result `acc + acc_m` (the
    /// reference's Q4_1 formula).
    #[inline(always)]
    fn tile_q4_1<const NT: usize>(w: &[BlockQ41x16], acts: &[BlockQ8O], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8O]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F is enabled in the only caller.
        let (mut acc, mut acc_m) = ([unsafe { _mm512_setzero_ps() }; NT], [unsafe { _mm512_setzero_ps() }; NT]);
        for (b, blk) in w.iter().enumerate() {
            prefetch(blk.qs.as_ptr(), 5);
            let (q, d, m) = unpack_q4_1(blk);
            for t in 0..NT {
                let a = &x[t][b];
                q4_1_add(&mut acc[t], &mut acc_m[t], d, m, a, block_sum(&q, a, 0));
            }
        }
        for t in 0..NT {
            // SAFETY: AVX-512F is enabled in the only caller.
            store16(out, t0 + t, r0, unsafe { _mm512_add_ps(acc[t], acc_m[t]) });
        }
    }

    /// Q8_0: per token sumi = Σ (w + 128)·x - 128·Σ x, then `acc += (d_w·d_x)·sumi`.
    #[inline(always)]
    fn tile_q8_0<const NT: usize>(w: &[BlockQ80x16], acts: &[BlockQ8O], nb: usize, t0: usize, r0: usize, out: &SharedOut) {
        let x: [&[BlockQ8O]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * nb..(t0 + i + 1) * nb]);
        // SAFETY: AVX-512F is enabled in the only caller.
        let mut acc = [unsafe { _mm512_setzero_ps() }; NT];
        for (b, blk) in w.iter().enumerate() {
            prefetch(blk.qs.as_ptr(), 9);
            let (q, d) = unpack_q8_0(blk);
            for t in 0..NT {
                let a = &x[t][b];
                add(&mut acc[t], scaled(d, a, block_sum(&q, a, a.off << 3)));
            }
        }
        for (t, a) in acc.iter().enumerate() {
            store16(out, t0 + t, r0, *a);
        }
    }

    /// The tile's rows per group (a check on `group_tiles`'s unit).
    const _: () = assert!(ROWS == 16);
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
