//! AMX-INT8 tile matmul for prefill over the 16-row repacked layouts (`x16`, `x16q`, `x16k`), on CPUs
//! that have AMX (Intel Sapphire Rapids and later; chosen at run time, see
//! `simd::amx_status`). Batches of 16+ tokens only: whole 16-token tiles run here, the other
//! tokens (decode, small tails) on the `x16` kernels, which give the same bits.
//!
//! Why it is bitwise the scalar reference: the `x16` kernels compute, per (row, token), each
//! block's (or sub-block's) exact integer sum, then the reference's float formula in block
//! order. One `TDPBSUD` with K = one block's bytes (a 16-token × K-byte A tile of signed
//! activations, a K/4 × 64-byte B tile of unsigned weights, a zeroed C tile) gives exactly
//! those integer sums for 16 tokens × 16 rows at once; the float half ([`AmxBlock::combine`])
//! is the `x16` kernel's own AVX-512 sequence over the stored C tile, block by block. Types
//! whose weights fit in i8 (Q4_0, Q5_0, Q8_0) put the weights themselves in the B tile and use
//! `TDPBSSD`: the tile's sum is then the reference's sumi, with no offset to add per token.
//!
//! The x16 layout (vector k, lane r: row r's elements 4k..4k + 4) is already the VNNI "B"
//! layout, so a block's B tiles are its nibbles unpacked into a per-thread scratch (once per
//! 16-row group for all its token tiles) or, for Q6_K, the packed bytes themselves. A tiles are
//! read straight from the quantized activations with a row stride of one token's blocks.
//!
//! Up to 4 groups of 16 rows at a time: their B tiles unpacked, then each 16-token tile against
//! each group, the next step's tile products issued before the last step's sums are read back.
//! The tile instructions are written with `asm!` (Rust's AMX intrinsics are unstable); tiles
//! 0-5 hold two products in flight: A in tmm0/tmm3, B in tmm1/tmm4, C in tmm2/tmm5.
//! A new weight type plugs in by implementing [`AmxBlock`] for its `Block16`.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

use super::quant::BlockQ8K;
use super::shared::SharedOut;
use super::x16::{store16, unpack_q5, Block16, BlockQ5x16, BlockQ8O, Packed16, ROWS};
use super::x16k::{q4k_add, q4k_mins, BlockQ4Kx16, BlockQ6Kx16};
use super::x16q::{add, q4_1_dot, q4_1_min, scaled, unpack_q4_0, unpack_q4_1, BlockQ40x16, BlockQ41x16, BlockQ80x16};

/// Tokens per tile (rows of the A and C tiles).
pub const TOK: usize = 16;

/// A 16-row block type the tile driver multiplies: how its blocks become B tiles and how the
/// tiles' integer sums become the reference's float result.
pub trait AmxBlock: Block16 {
    /// The quantized activation block it is multiplied with.
    type Act: Copy;
    /// Tile products per block (each over `K` bytes of every row).
    const UNITS: usize;
    /// Bytes of K per product: a multiple of 4, at most 64 (A: 16 × K bytes, B: K/4 × 64).
    const K: usize;
    /// Whether the B tiles hold the weights themselves as signed bytes (`TDPBSSD`: the tile
    /// gives Σ w·x with no offset term left for the combine) rather than unsigned ones
    /// (`TDPBSUD`). False by default.
    const SIGNED: bool = false;
    /// Byte offset in `Act` of the `K` activation bytes of unit `u`.
    fn act_at(u: usize) -> usize;
    /// The block's `UNITS` B tiles (K/4 rows of 64 bytes each, one after another, unsigned
    /// bytes): written to `dst` (`UNITS * K * 16` bytes) and `dst` returned, or the block's own
    /// bytes when they already are that.
    ///
    /// # Safety
    /// AVX-512F/BW must be enabled in the caller; `dst` must be valid for the bytes above.
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8;
    /// Adds the block's term to the 16 tokens' accumulators (lane r: row r). `sums[256 u + 16 t
    /// + r]`: unit u's exact Σ w·x of token t and row r; token t's activation block is
    /// `acts[t * stride]`.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI and F16C must be enabled in the caller; `sums.len() >= 256 * UNITS`;
    /// `acts.len() > 15 * stride`.
    unsafe fn combine(&self, sums: &[i32], acts: &[Self::Act], stride: usize, acc: &mut [__m512; TOK]);
    /// A second sum per token over all the blocks `w` of a row group, in block order, for types
    /// whose reference keeps two (Q4_1's min terms): a pass of its own, so that neither pass's
    /// 16 accumulators leave the registers. Token t's block b is `acts[t * stride + b]`. None
    /// by default.
    ///
    /// # Safety
    /// As [`combine`](Self::combine), with `acts.len() > 15 * stride + w.len() - 1`.
    #[inline(always)]
    unsafe fn side(_w: &[Self], _acts: &[Self::Act], _stride: usize, _acc2: &mut [__m512; TOK]) {}
    /// A token's result from its two accumulators after the last block (`acc` unless the type
    /// keeps two sums).
    ///
    /// # Safety
    /// AVX-512F must be enabled in the caller.
    #[inline(always)]
    unsafe fn result(acc: __m512, _acc2: __m512) -> __m512 {
        acc
    }
}

/// The `x16` kernel of a type (`x16::matmul_rows_q5_0`, ...): what runs the tokens after the
/// last whole tile.
pub type RestKernel<B> = unsafe fn(&Packed16<B>, Range<usize>, &[<B as AmxBlock>::Act], usize, &SharedOut);

/// Rows `rows` (whole groups of 16) of `p` for `n_tok` tokens: whole 16-token tiles on AMX, the
/// other tokens with `rest` (the type's `x16` kernel, same bits).
///
/// # Safety
/// `simd::amx_usable()` must be true (AMX-INT8, tile permission, the AVX-512 level).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn matmul_rows<B: AmxBlock>(
    p: &Packed16<B>,
    rows: Range<usize>,
    acts: &[B::Act],
    n_tok: usize,
    out: &SharedOut,
    rest: RestKernel<B>,
) {
    let n16 = n_tok / TOK * TOK;
    let nb = p.cols / B::QB;
    if n16 > 0 {
        // SAFETY: the caller's promise.
        unsafe { tiles(p, rows.clone(), acts, n16, out) };
    }
    if n16 < n_tok {
        // SAFETY: `rest` is a kernel of the AVX-512 level, which the caller's promise includes.
        unsafe { rest(p, rows, &acts[n16 * nb..], n_tok - n16, &out.tokens_from(n16)) };
    }
}

/// 16-row groups whose B tiles are unpacked together (the backend's row chunks are at most 64
/// rows, so usually all of a call's; 1, 4 and 8 measured within 10% of each other).
const SUB: usize = 4;

/// Pipeline steps whose C tiles are in `Scratch::sums` at once, for types of one product per
/// block: step i + 2's products are issued before step i's sums are read (with 2, only step
/// i + 1's: more time for the tile stores before the vector loads read them). Types of several
/// products per block keep 2 (their C tiles are 8-16 KiB a step; 3 steps of Q6_K fill L1).
const DEPTH: usize = 3;

/// The pipeline depth of `B` (see [`DEPTH`]).
const fn depth<B: AmxBlock>() -> usize {
    if B::UNITS == 1 {
        DEPTH
    } else {
        2
    }
}

/// Per-thread buffers of [`tiles`] (kept between calls: no allocation once warm).
#[derive(Default)]
struct Scratch {
    /// up to `SUB` 16-row groups' B tiles, block by block
    b: Vec<Line>,
    /// C tiles of `depth` pipeline steps
    sums: Vec<i32>,
    /// where each of those blocks' B tiles are
    at: Vec<usize>,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// The tile configuration (palette 1): tmm0/tmm3 A (16 × K bytes), tmm1/tmm4 B (K/4 × 64),
/// tmm2/tmm5 C (16 × 64).
#[repr(C, align(64))]
struct TileCfg {
    palette: u8,
    start_row: u8,
    _reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileCfg {
    fn new(k: usize) -> TileCfg {
        let mut c = TileCfg { palette: 1, start_row: 0, _reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for (a, b, cc) in [(0, 1, 2), (3, 4, 5)] {
            (c.colsb[a], c.rows[a]) = (k as u16, TOK as u8);
            (c.colsb[b], c.rows[b]) = (64, (k / 4) as u8);
            (c.colsb[cc], c.rows[cc]) = (64, TOK as u8);
        }
        c
    }
}

/// The whole 16-token tiles (`n_tok` a multiple of 16).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tiles<B: AmxBlock>(p: &Packed16<B>, rows: Range<usize>, acts: &[B::Act], n_tok: usize, out: &SharedOut) {
    let nb = p.cols / B::QB;
    assert!(n_tok % TOK == 0 && B::K % 4 == 0 && B::K <= 64);
    // a range ends on a group boundary or at the last row (the last group padded, as in `x16`)
    assert!(rows.start % ROWS == 0 && (rows.end % ROWS == 0 || rows.end == p.rows) && rows.end <= p.rows, "rows {rows:?} of {}", p.rows);
    assert!(acts.len() >= n_tok * nb && p.blocks.len() == p.rows.div_ceil(ROWS) * nb);
    let tb = B::K * 16;
    // Taken out of the thread-local (not borrowed in a closure) so everything below stays in
    // this function's target features.
    let mut s = SCRATCH.take();
    // blocks per pipeline step: two for one product per block (two products in flight)
    let span = if B::UNITS == 1 { 2 } else { 1 };
    let depth = depth::<B>();
    s.sums.resize(depth * span * B::UNITS * 256, 0);
    let sub = SUB;
    s.b.resize(sub * nb * B::UNITS * tb / 64, Line([0; 64]));
    s.at.resize(sub * nb, 0);
    let cfg = TileCfg::new(B::K);
    let stride = nb * std::mem::size_of::<B::Act>();
    // SAFETY: the caller promised AMX with tile permission; `cfg` is a valid palette-1 config.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly)) };
    let (g_end, mut g0) = (rows.end.div_ceil(ROWS), rows.start / ROWS);
    // Up to `sub` groups at a time: their B tiles unpacked once, then every token tile against
    // each of them (a token tile's A rows are read from L1 after the first group).
    while g0 < g_end {
        let g1 = (g0 + sub).min(g_end);
        let bbuf = s.b.as_mut_ptr() as *mut u8;
        for (i, blk) in p.blocks[g0 * nb..g1 * nb].iter().enumerate() {
            // SAFETY: AVX-512 is enabled here; slot i is `UNITS * tb` bytes inside `s.b`.
            s.at[i] = unsafe { blk.b_tiles(bbuf.add(i * B::UNITS * tb)) } as usize;
        }
        for t0 in (0..n_tok).step_by(TOK) {
            for g in g0..g1 {
                let w = &p.blocks[g * nb..(g + 1) * nb];
                let at = &s.at[(g - g0) * nb..(g - g0 + 1) * nb];
                let x = &acts[t0 * nb..];
                let (mut acc, mut acc2) = ([_mm512_setzero_ps(); TOK], [_mm512_setzero_ps(); TOK]);
                // Software pipeline: step i's products (its `SPAN` blocks) are issued depth - 1
                // steps before its sums are read back (a tile store read at once by vector loads
                // stalls).
                let n_steps = nb.div_ceil(span);
                let sums = s.sums.as_mut_ptr();
                for i in 0..(depth - 1).min(n_steps) {
                    // SAFETY (all calls): see `issue`; `x` holds the tile's 16 tokens' blocks, `at`
                    // this group's B tiles, `sums` `depth` parts of `span * UNITS` C tiles.
                    unsafe { issue::<B>(x, at, sums, i, span, nb, stride, tb) };
                }
                for i in 0..n_steps {
                    if i + depth - 1 < n_steps {
                        // SAFETY: as above.
                        unsafe { issue::<B>(x, at, sums, i + depth - 1, span, nb, stride, tb) };
                    }
                    let (b, half) = (i * span, (i % depth) * span * B::UNITS * 256);
                    for k in 0..span.min(nb - b) {
                        // SAFETY: AVX-512 VNNI and F16C are enabled here; block b + k's sums start
                        // at `half + k * UNITS * 256` and were stored by `issue(i)`.
                        unsafe {
                            let sums = std::slice::from_raw_parts(sums.add(half + k * B::UNITS * 256), B::UNITS * 256);
                            w[b + k].combine(sums, &x[b + k..], nb, &mut acc)
                        };
                    }
                }
                // SAFETY: AVX-512 is enabled here; `x` holds the 16 tokens' `nb` blocks.
                unsafe { B::side(w, x, nb, &mut acc2) };
                for t in 0..TOK {
                    // SAFETY: AVX-512F is enabled here.
                    store16(out, t0 + t, g * ROWS, unsafe { B::result(acc[t], acc2[t]) });
                }
            }
        }
        g0 = g1;
    }
    // SAFETY: AMX is present (the caller's promise); releases the tile state configured above.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
    SCRATCH.set(s);
}

/// Issues pipeline step i's tile products (blocks `i * span..`, at most `span` of them, every
/// unit): their C tiles go to part `i % depth::<B>()` of `sums`. A function, not a closure: a
/// closure does not inherit the kernel's target features and, called, forces the accumulators
/// out of registers.
///
/// # Safety
/// Tiles configured by [`tiles`]; `x` holds 16 tokens' `nb` blocks `stride` bytes apart (token 15's
/// last byte inside it); `at[b]` points at block b's `UNITS * K * 16` bytes of B tiles; `sums`
/// is valid for `depth::<B>() * span * UNITS * 256` i32.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn issue<B: AmxBlock>(x: &[B::Act], at: &[usize], sums: *mut i32, i: usize, span: usize, nb: usize, stride: usize, tb: usize) {
    let (b, half) = (i * span, (i % depth::<B>()) * span * B::UNITS * 256);
    let n_ops = span.min(nb - b) * B::UNITS;
    let mut o = 0;
    while o < n_ops {
        let (bi, u) = (b + o / B::UNITS, o % B::UNITS);
        let a0 = (&x[bi] as *const B::Act as *const u8).wrapping_add(B::act_at(u));
        let (b0, c0) = ((at[bi] + u * tb) as *const u8, sums.wrapping_add(half + o * 256));
        // SAFETY: A rows are the 16 tokens' `K` bytes at `act_at(u)` of block bi (the caller's
        // promise); B is `tb` bytes of the block's tiles; C is 1 KiB inside `sums`.
        unsafe {
            if o + 1 < n_ops {
                let (bi, u) = (b + (o + 1) / B::UNITS, (o + 1) % B::UNITS);
                let a1 = (&x[bi] as *const B::Act as *const u8).wrapping_add(B::act_at(u));
                let (b1, c1) = ((at[bi] + u * tb) as *const u8, sums.wrapping_add(half + (o + 1) * 256));
                if B::SIGNED {
                    tdp2_ss(a0, a1, stride, b0, b1, c0, c1)
                } else {
                    tdp2(a0, a1, stride, b0, b1, c0, c1)
                }
                o += 2;
            } else {
                if B::SIGNED {
                    tdp1_ss(a0, stride, b0, c0)
                } else {
                    tdp1(a0, stride, b0, c0)
                }
                o += 1;
            }
        }
    }
}

/// Emits a pair of product sequences for one tile instruction (`tdpbsud`: signed A × unsigned
/// B bytes, or `tdpbssd`: both signed): `$two` (two independent products, C0 = A0·B0 and C1 =
/// A1·B1) and `$one` (C0 = A0·B0), each C tile zeroed first and stored.
macro_rules! tdp_fns {
    ($two:ident, $one:ident, $op:literal) => {
        /// Two independent products C0 = A0·B0 and C1 = A1·B1, stored (see `tdp_fns!`).
        ///
        /// # Safety
        /// Tiles configured by [`tiles`]; A: 16 rows of K bytes `sa` apart; B: K/4 rows of 64
        /// bytes; C: 1 KiB writable.
        #[inline(always)]
        unsafe fn $two(a0: *const u8, a1: *const u8, sa: usize, b0: *const u8, b1: *const u8, c0: *mut i32, c1: *mut i32) {
            // SAFETY: the caller's promise; the tile registers are not allocated by the compiler.
            unsafe {
                asm!(
                    "tileloadd tmm0, [{a0} + {sa}]",
                    "tileloadd tmm1, [{b0} + {s64}]",
                    "tilezero tmm2",
                    "tileloadd tmm3, [{a1} + {sa}]",
                    "tileloadd tmm4, [{b1} + {s64}]",
                    "tilezero tmm5",
                    concat!($op, " tmm2, tmm0, tmm1"),
                    concat!($op, " tmm5, tmm3, tmm4"),
                    "tilestored [{c0} + {s64}], tmm2",
                    "tilestored [{c1} + {s64}], tmm5",
                    a0 = in(reg) a0, a1 = in(reg) a1, sa = in(reg) sa, b0 = in(reg) b0, b1 = in(reg) b1,
                    c0 = in(reg) c0, c1 = in(reg) c1, s64 = in(reg) 64usize,
                    options(nostack)
                )
            }
        }

        /// One product C0 = A0·B0, stored.
        ///
        /// # Safety
        /// As the two-product function of the same `tdp_fns!`.
        #[inline(always)]
        unsafe fn $one(a0: *const u8, sa: usize, b0: *const u8, c0: *mut i32) {
            // SAFETY: the caller's promise; the tile registers are not allocated by the compiler.
            unsafe {
                asm!(
                    "tileloadd tmm0, [{a0} + {sa}]",
                    "tileloadd tmm1, [{b0} + {s64}]",
                    "tilezero tmm2",
                    concat!($op, " tmm2, tmm0, tmm1"),
                    "tilestored [{c0} + {s64}], tmm2",
                    a0 = in(reg) a0, sa = in(reg) sa, b0 = in(reg) b0, c0 = in(reg) c0, s64 = in(reg) 64usize,
                    options(nostack)
                )
            }
        }
    };
}
tdp_fns!(tdp2, tdp1, "tdpbsud");
tdp_fns!(tdp2_ss, tdp1_ss, "tdpbssd");

/// `$body` once for each token t of a tile, t a constant (LLVM does not always unroll the loop,
/// and then the 16 accumulators live on the stack: a load and a store per token and block).
macro_rules! each_token {
    ($t:ident => $body:block) => {
        each_token!(@ $t $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $t:ident $body:block; $($n:literal)*) => {
        $({
            let $t: usize = $n;
            $body
        })*
    };
}

/// Token t's activation block in a combine (unchecked: a bounds check per token keeps LLVM
/// from unrolling the 16 tokens, and the accumulators then live on the stack).
///
/// # Safety
/// `t * stride < acts.len()` (the combine's contract: `acts.len() > 15 * stride`, t < 16).
#[inline(always)]
unsafe fn act<A>(acts: &[A], stride: usize, t: usize) -> &A {
    debug_assert!(t * stride < acts.len());
    // SAFETY: the caller's promise.
    unsafe { acts.get_unchecked(t * stride) }
}

/// Token t's 16 row sums of unit u.
#[inline(always)]
unsafe fn sum_row(sums: &[i32], u: usize, t: usize) -> __m512i {
    debug_assert!(sums.len() >= 256 * u + 16 * t + 16);
    // SAFETY: AVX-512F in every caller; 16 i32 inside `sums` (the callers' contract).
    unsafe { _mm512_loadu_si512(sums.as_ptr().add(256 * u + 16 * t) as *const __m512i) }
}

/// Q5_0: one product per block (K = 32) over the signed weights u - 16, so the tile's sum is
/// sumi itself (the x16 kernel's `off + Σ u·x`); `x16::tile`'s float sequence.
impl AmxBlock for BlockQ5x16 {
    type Act = BlockQ8O;
    const UNITS: usize = 1;
    const K: usize = 32;
    const SIGNED: bool = true;

    fn act_at(_: usize) -> usize {
        std::mem::offset_of!(BlockQ8O, qs)
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8 {
        // SAFETY: the caller's promise (AVX-512, 512 writable bytes at `dst`).
        unsafe { store_b(&unpack_q5(self).0, 16, dst) }
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8O], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; `d` is 32 bytes.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr() as *const __m256i));
            each_token!(t => {
                let sc = _mm512_mul_ps(d, _mm512_set1_ps(act(acts, stride, t).d));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(sc, _mm512_cvtepi32_ps(sum_row(sums, 0, t))));
            });
        }
    }
}

/// Q4_K: one product per 32-element sub-block (K = 32); `x16k::tile`'s integer and float
/// sequence.
impl AmxBlock for BlockQ4Kx16 {
    type Act = BlockQ8K;
    const UNITS: usize = 8;
    const K: usize = 32;

    fn act_at(u: usize) -> usize {
        std::mem::offset_of!(BlockQ8K, qs) + 32 * u
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8 {
        // SAFETY: the caller's promise (AVX-512, 4096 writable bytes at `dst`); reads stay in `qs`.
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            for j in 0..8 {
                for v in 0..4 {
                    let raw = _mm512_loadu_si512(self.qs.as_ptr().add(256 * j + 64 * v) as *const __m512i);
                    _mm512_storeu_si512(dst.add(512 * j + 64 * v) as *mut __m512i, _mm512_and_si512(raw, nib));
                    _mm512_storeu_si512(dst.add(512 * j + 64 * (v + 4)) as *mut __m512i, _mm512_and_si512(_mm512_srli_epi16::<4>(raw), nib));
                }
            }
        }
        dst
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8K], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; loads stay inside `sc`, `mn`, `d`, `dmin`, `bsums`.
        unsafe {
            let mut sc = [_mm512_setzero_si512(); 8];
            for (i, v) in sc.iter_mut().enumerate() {
                *v = _mm512_cvtepu8_epi32(_mm_loadu_si128(self.sc.as_ptr().add(16 * i) as *const __m128i));
            }
            let m = q4k_mins(self);
            for (t, acc) in acc.iter_mut().enumerate() {
                let mut isc = _mm512_setzero_si512();
                for (j, scj) in sc.iter().enumerate() {
                    isc = _mm512_add_epi32(isc, _mm512_mullo_epi32(sum_row(sums, j, t), *scj));
                }
                // x16k's float step, so the bits are the x16 kernel's
                *acc = q4k_add(*acc, isc, &m, act(acts, stride, t));
            }
        }
    }
}

/// Q6_K: one product per 16-element scale group (K = 16); the packed bytes are the B tiles
/// (unit 2u + h: `q[512u + 256h..]`); `x16k::tile6`'s integer and float sequence.
impl AmxBlock for BlockQ6Kx16 {
    type Act = BlockQ8K;
    const UNITS: usize = 16;
    const K: usize = 16;

    fn act_at(u: usize) -> usize {
        std::mem::offset_of!(BlockQ8K, qs) + 16 * u
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, _: *mut u8) -> *const u8 {
        self.q.as_ptr()
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8K], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; loads stay inside `sc`, `sc2`, `d`, `bsums`.
        unsafe {
            let mut sc = [_mm512_setzero_si512(); 16];
            for (g, s) in sc.iter_mut().enumerate() {
                *s = _mm512_cvtepi8_epi32(_mm_loadu_si128(self.sc.as_ptr().add(16 * g) as *const __m128i));
            }
            let mut sc2 = [_mm512_setzero_si512(); 8];
            for (i, s) in sc2.iter_mut().enumerate() {
                *s = _mm512_cvtepi8_epi16(_mm256_loadu_si256(self.sc2.as_ptr().add(32 * i) as *const __m256i));
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr() as *const __m256i));
            for (t, acc) in acc.iter_mut().enumerate() {
                let xb = act(acts, stride, t);
                let mut isc = _mm512_setzero_si512();
                for (g, s) in sc.iter().enumerate() {
                    isc = _mm512_add_epi32(isc, _mm512_mullo_epi32(sum_row(sums, g, t), *s));
                }
                let bs = xb.bsums.as_ptr() as *const i32;
                let mut off = _mm512_setzero_si512();
                for (i, s2) in sc2.iter().enumerate() {
                    off = _mm512_dpwssd_epi32(off, *s2, _mm512_set1_epi32(bs.add(i).read_unaligned()));
                }
                let sum = _mm512_sub_epi32(isc, _mm512_slli_epi32::<5>(off));
                // (d_w·d_x)·sum, added in block order: the reference's rounding
                let d = _mm512_mul_ps(dw, _mm512_set1_ps(xb.d));
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sum)));
            }
        }
    }
}

/// Stores a block's 8 weight vectors (vector k, lane r: row r's elements 4k..4k + 4, as u8
/// values u) as its signed B tile of weights u - `bias` (K = 32: 8 rows of 64 bytes; the byte
/// subtraction wraps, so a bias of 128 flips the sign bit).
///
/// # Safety
/// AVX-512F/BW in the caller; 512 writable bytes at `dst`.
#[inline(always)]
unsafe fn store_b(q: &[__m512i; 8], bias: u8, dst: *mut u8) -> *const u8 {
    // SAFETY: the caller's promise.
    unsafe {
        let bias = _mm512_set1_epi8(bias as i8);
        for (k, v) in q.iter().enumerate() {
            _mm512_storeu_si512(dst.add(64 * k) as *mut __m512i, _mm512_sub_epi8(*v, bias));
        }
    }
    dst
}

/// Q4_0: one product per block (K = 32) over the signed weights u - 8, so the tile's sum is
/// sumi itself (the x16 kernel's `off / 2 + Σ u·x`), then `x16q::tile_q4_0`'s float step.
impl AmxBlock for BlockQ40x16 {
    type Act = BlockQ8O;
    const UNITS: usize = 1;
    const K: usize = 32;
    const SIGNED: bool = true;

    fn act_at(_: usize) -> usize {
        std::mem::offset_of!(BlockQ8O, qs)
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8 {
        // SAFETY: the caller's promise (AVX-512, 512 writable bytes at `dst`).
        unsafe { store_b(&unpack_q4_0(self).0, 8, dst) }
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8O], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; `d` is 32 bytes.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr() as *const __m256i));
            each_token!(t => {
                add(&mut acc[t], scaled(d, act(acts, stride, t), sum_row(sums, 0, t)));
            });
        }
    }
}

/// Q4_1: one product per block (K = 32) over the nibbles u; sumi = Σ u·x, then
/// `x16q::tile_q4_1`'s two fused sums (the min terms in a pass of their own, `side`), added at
/// the end.
impl AmxBlock for BlockQ41x16 {
    type Act = BlockQ8O;
    const UNITS: usize = 1;
    const K: usize = 32;

    fn act_at(_: usize) -> usize {
        std::mem::offset_of!(BlockQ8O, qs)
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8 {
        // SAFETY: the caller's promise (AVX-512, 512 writable bytes at `dst`).
        unsafe { store_b(&unpack_q4_1(self).0, 0, dst) }
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8O], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; `d` and `m` are 32 bytes each.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr() as *const __m256i));
            each_token!(t => {
                q4_1_dot(&mut acc[t], d, act(acts, stride, t), sum_row(sums, 0, t));
            });
        }
    }

    #[inline(always)]
    unsafe fn side(w: &[Self], acts: &[BlockQ8O], stride: usize, acc2: &mut [__m512; TOK]) {
        for (b, blk) in w.iter().enumerate() {
            let x = &acts[b..];
            // SAFETY: the caller's promise; `m` is 32 bytes; token t's block b is `x[t * stride]`.
            unsafe {
                let m = _mm512_cvtph_ps(_mm256_loadu_si256(blk.m.as_ptr() as *const __m256i));
                each_token!(t => {
                    q4_1_min(&mut acc2[t], m, act(x, stride, t));
                });
            }
        }
    }

    #[inline(always)]
    unsafe fn result(acc: __m512, acc2: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_add_ps(acc, acc2) }
    }
}

/// Q8_0: one product per block (K = 32); the stored bytes w + 128 with the sign bit flipped
/// back are the signed B tile, so the tile's sum is sumi itself (the x16 kernel's
/// `8·off + Σ (w + 128)·x`), then `x16q::tile_q8_0`'s float step.
impl AmxBlock for BlockQ80x16 {
    type Act = BlockQ8O;
    const UNITS: usize = 1;
    const K: usize = 32;
    const SIGNED: bool = true;

    fn act_at(_: usize) -> usize {
        std::mem::offset_of!(BlockQ8O, qs)
    }

    #[inline(always)]
    unsafe fn b_tiles(&self, dst: *mut u8) -> *const u8 {
        // SAFETY: the caller's promise (AVX-512, 512 writable bytes at `dst`); loads read `qs`.
        unsafe {
            let mut q = [_mm512_setzero_si512(); 8];
            for (k, v) in q.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(self.qs.as_ptr().add(64 * k) as *const __m512i);
            }
            store_b(&q, 128, dst)
        }
    }

    #[inline(always)]
    unsafe fn combine(&self, sums: &[i32], acts: &[BlockQ8O], stride: usize, acc: &mut [__m512; TOK]) {
        // SAFETY: the caller's promise; `d` is 32 bytes.
        unsafe {
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr() as *const __m256i));
            each_token!(t => {
                add(&mut acc[t], scaled(d, act(acts, stride, t), sum_row(sums, 0, t)));
            });
        }
    }
}

#[cfg(test)]
#[path = "amx_tests.rs"]
mod tests;
