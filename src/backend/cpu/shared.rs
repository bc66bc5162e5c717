//! Output buffers shared by a parallel region whose threads write disjoint parts.

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

    /// Writes `out[t, r] = v`. Callers must own row `r` (one chunk per row).
    #[inline]
    pub fn write(&self, t: usize, r: usize, v: f32) {
        let i = t * self.rows + r;
        assert!(i < self.len);
        // SAFETY: in bounds (asserted); no other thread writes row r (see the Sync impl).
        unsafe { *self.ptr.add(i) = v }
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
