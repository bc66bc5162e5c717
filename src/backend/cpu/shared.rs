//! Output buffers shared by a parallel region whose threads write disjoint parts, and the
//! token-tile row loop every SIMD matmul shares.

use crate::backend::WeightView;
use crate::gguf::QK;

/// A `[n_tok, rows]` output matrix: thread-safe writes of disjoint rows.
pub struct SharedOut {
    ptr: *mut f32,
    len: usize,
    /// row stride of a token: the matrix's rows
    rows: usize,
}

// SAFETY: threads write disjoint indices (each row is owned by the one chunk that contains it),
// and the buffer outlives the parallel region (borrowed mutably for the whole call).
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub fn new(out: &mut [f32], rows: usize) -> SharedOut {
        SharedOut { ptr: out.as_mut_ptr(), len: out.len(), rows }
    }

    /// The matrix's rows (a token's row stride).
    #[inline]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Writes `out[t, r] = v`. Callers must own row `r` (one chunk per row).
    #[inline]
    pub fn write(&self, t: usize, r: usize, v: f32) {
        let i = t * self.rows + r;
        assert!(i < self.len);
        // SAFETY: in bounds (asserted); no other thread writes row r (see the Sync impl).
        unsafe { *self.ptr.add(i) = v }
    }
}

impl SharedOut {
    /// The same matrix from token `t0` on: token t of the view is token `t0 + t`.
    pub fn tokens_from(&self, t0: usize) -> SharedOut {
        let i = t0 * self.rows;
        assert!(i <= self.len);
        SharedOut { ptr: self.ptr.wrapping_add(i), len: self.len - i, rows: self.rows }
    }

    /// Writes `out[t, r0..r0 + v.len()] = v`. Callers must own those rows.
    #[inline]
    pub fn write_run(&self, t: usize, r0: usize, v: &[f32]) {
        let i = t * self.rows + r0;
        assert!(r0 + v.len() <= self.rows && i + v.len() <= self.len);
        // SAFETY: in bounds (asserted); no other thread writes these rows (see the Sync impl).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(i), v.len()) }
    }
}

impl SharedOut {
    /// Token t's rows `rows` as a slice.
    ///
    /// # Safety
    /// No other thread may access these elements while the slice lives (the caller owns the rows).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn run_mut(&self, t: usize, rows: std::ops::Range<usize>) -> &mut [f32] {
        let i = t * self.rows + rows.start;
        assert!(rows.start <= rows.end && rows.end <= self.rows && i + rows.len() <= self.len);
        // SAFETY: in bounds (asserted); exclusive access is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i), rows.len()) }
    }
}

/// A slice whose disjoint sub-ranges are handed to different threads.
pub struct SharedSlice<B>(*mut B, usize);

// SAFETY: callers only hand out disjoint sub-ranges to different threads.
unsafe impl<B: Send> Sync for SharedSlice<B> {}

impl<B> SharedSlice<B> {
    pub fn new(s: &mut [B]) -> SharedSlice<B> {
        SharedSlice(s.as_mut_ptr(), s.len())
    }

    /// # Safety
    /// No two threads may hold overlapping ranges at once.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, at: usize, n: usize) -> &mut [B] {
        assert!(at + n <= self.1);
        // SAFETY: in bounds (asserted); disjointness is the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), n) }
    }
}

/// Rows `rows` of `w` against `n_tok` quantized activation rows of one block per 32 values
/// (`acts`: [n_tok, cols / 32], e.g. `quant::BlockQ8`) in token tiles of 4 (`k4`: one weight row
/// against 4 activation rows, each weight block unpacked once), then single tokens (`k1`).
/// Kernels give every token the same instruction sequence whatever the tile size, so a token's
/// result does not depend on its batch.
#[inline(always)]
pub fn tile_rows<A>(
    w: WeightView<'_>,
    rows: std::ops::Range<usize>,
    acts: &[A],
    n_tok: usize,
    out: &SharedOut,
    k4: impl Fn(&[u8], [&[A]; 4], &mut [f32; 4]),
    k1: impl Fn(&[u8], [&[A]; 1], &mut [f32; 1]),
) {
    tile_rows_with(w, rows, acts, w.cols / QK, n_tok, out, k4, k1)
}

/// [`tile_rows`] for any activation layout: token t's activations are
/// `acts[t * stride..(t + 1) * stride]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn tile_rows_with<A>(
    w: WeightView<'_>,
    rows: std::ops::Range<usize>,
    acts: &[A],
    stride: usize,
    n_tok: usize,
    out: &SharedOut,
    k4: impl Fn(&[u8], [&[A]; 4], &mut [f32; 4]),
    k1: impl Fn(&[u8], [&[A]; 1], &mut [f32; 1]),
) {
    tiles_from(w, rows, acts, stride, 0, n_tok, out, &k4, &k1)
}

/// [`tile_rows_with`] with token tiles of 8 first (then one of 4, then single tokens), for
/// kernels whose per-block unpacking is worth sharing across more tokens (AVX-512). A token's
/// instruction sequence is the same in every tile size, so its result does not depend on its
/// batch.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn tile_rows_with8<A>(
    w: WeightView<'_>,
    rows: std::ops::Range<usize>,
    acts: &[A],
    stride: usize,
    n_tok: usize,
    out: &SharedOut,
    k8: impl Fn(&[u8], [&[A]; 8], &mut [f32; 8]),
    k4: impl Fn(&[u8], [&[A]; 4], &mut [f32; 4]),
    k1: impl Fn(&[u8], [&[A]; 1], &mut [f32; 1]),
) {
    let mut t0 = 0;
    while t0 + 8 <= n_tok {
        tile(w, rows.clone(), acts, stride, t0, out, &k8);
        t0 += 8;
    }
    tiles_from(w, rows, acts, stride, t0, n_tok, out, &k4, &k1)
}

/// Tokens `t0..n_tok` in tiles of 4, then single tokens.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tiles_from<A>(
    w: WeightView<'_>,
    rows: std::ops::Range<usize>,
    acts: &[A],
    stride: usize,
    mut t0: usize,
    n_tok: usize,
    out: &SharedOut,
    k4: &impl Fn(&[u8], [&[A]; 4], &mut [f32; 4]),
    k1: &impl Fn(&[u8], [&[A]; 1], &mut [f32; 1]),
) {
    while t0 + 4 <= n_tok {
        tile(w, rows.clone(), acts, stride, t0, out, k4);
        t0 += 4;
    }
    for t in t0..n_tok {
        tile(w, rows.clone(), acts, stride, t, out, k1);
    }
}

/// Rows `rows` against the tokens `t0..t0 + NT` with the kernel `k`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<A, const NT: usize>(
    w: WeightView<'_>,
    rows: std::ops::Range<usize>,
    acts: &[A],
    stride: usize,
    t0: usize,
    out: &SharedOut,
    k: &impl Fn(&[u8], [&[A]; NT], &mut [f32; NT]),
) {
    let x: [&[A]; NT] = std::array::from_fn(|i| &acts[(t0 + i) * stride..(t0 + i + 1) * stride]);
    for r in rows {
        let mut o = [0f32; NT];
        k(w.row(r), x, &mut o);
        for (i, v) in o.into_iter().enumerate() {
            out.write(t0 + i, r, v);
        }
    }
}

/// How far ahead of the weight block being read the matmul kernels prefetch, in bytes. Decode is
/// a stream of weight reads; on the development VM the hardware prefetcher alone left the matmul
/// waiting on loads (`perf annotate`: a third of the samples on the instruction after the weight
/// load), and single-thread decode went from ~72 to 114 / 137 / 138 t/s with 1 / 4 / 8 KiB of
/// lead (docs/perf.md). 4 KiB keeps the overrun past a thread's chunk of rows small.
pub const PREFETCH_BYTES: usize = 4096;

/// Hints into L1 the cache line [`PREFETCH_BYTES`] past `w[at]`: a later block of the row, or a
/// following row (which the same chunk usually reads next). Past the end of the matrix it is a
/// wasted hint, never a fault.
#[inline(always)]
pub fn prefetch(w: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch neither faults nor reads architecturally; the address (possibly past the
    // end of the mapping) is only computed, never dereferenced. SSE is baseline on x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(at + PREFETCH_BYTES) as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, at);
}
