//! The CPU matmul driver: activations quantized once per call as the matrices' kernels read
//! them (`with_kernel`), rows handed out to the thread team in chunks (`rows_parallel`), and the
//! fused forms whose chunks also run an elementwise epilogue on the rows they computed
//! (`rows_fused`: gate|up with the activation, a projection with the residual add), so decode
//! runs those steps on both threads inside the matmul's region.

use std::ops::Range;

use super::quant::{act_format, ActFormat, BlockQ8, BlockQ8K};
use super::shared::{SharedOut, SharedSlice};
use super::{f32mm, quant, x16, CpuBackend, SimdLevel, MAX_MULTI};
#[cfg(target_arch = "aarch64")]
use super::neon;
#[cfg(target_arch = "x86_64")]
use super::{amx, avx2_k, avx512, avx512_k, x16k, x16q, Packed};
use crate::backend::offload::FfnActivation;
use crate::backend::{Backend, WeightView};
use crate::gguf::{QK, QK_K};

/// A kernel for rows of one of a call's matrices: `rows(m, range, out)` computes rows `range` of
/// matrix m for every token into `out`.
type RowsFn<'a> = dyn Fn(usize, std::ops::Range<usize>, &SharedOut) + Sync + 'a;

impl CpuBackend {
    /// Quantizes `x` ([n_tok, cols], the cols of every matrix in `ws`, one activation format) as
    /// `ws`'s kernels read it, then calls `run` with the kernel for their rows (which a parallel
    /// region hands out). Allocates nothing once the scratch has grown.
    pub(super) fn with_kernel(&self, ws: &[WeightView<'_>], x: &[f32], n_tok: usize, run: &mut dyn FnMut(&RowsFn<'_>)) {
        let Some(first) = ws.first() else { return };
        let (cols, fmt) = (first.cols, act_format(first.ty));
        assert!(ws.iter().all(|w| w.cols == cols && act_format(w.ty) == fmt), "with_kernel: matrices of different inputs");
        assert_eq!(x.len(), n_tok * cols, "matmul: x is not [n_tok, cols]");
        match fmt {
            ActFormat::F32 => run(&|m, rows, out| f32mm::matmul_rows(self.simd, ws[m], rows, x, n_tok, out)),
            ActFormat::Q8 => {
                let nb = cols / QK;
                let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                let s = &mut *s;
                // At the AVX-512 level, the types with a pair kernel read pairs; the others (Q8_0
                // among them: its kernel there takes blocks, see `avx512`) read blocks. A call whose
                // matrices need both gets both.
                let pairs_for = |w: &WeightView<'_>| self.simd == SimdLevel::Avx512Vnni && Self::has_pair_kernel(w.ty) && self.packed(w).is_none();
                #[cfg(target_arch = "x86_64")]
                let q8o: &[x16::BlockQ8O] = if ws.iter().any(|w| self.packed(w).is_some()) {
                    s.q8o.resize(n_tok * nb, x16::BlockQ8O::default());
                    // SAFETY: `packed` is only `Some` at the `Avx512Vnni` level, set only after
                    // detecting every feature `x16::quantize_q8o` enables.
                    self.quantize(x, n_tok, cols, nb, &mut s.q8o[..n_tok * nb], |x, b| unsafe { x16::quantize_q8o(x, b) });
                    &s.q8o[..n_tok * nb]
                } else {
                    &[]
                };
                #[cfg(target_arch = "x86_64")]
                let pairs: &[avx512::PairQ8] = if ws.iter().any(pairs_for) {
                    let np = nb.div_ceil(2);
                    s.pairs.resize(n_tok * np, avx512::PairQ8::default());
                    // SAFETY: `Avx512Vnni` is only set after detecting every feature
                    // `avx512::quantize_pairs` enables.
                    self.quantize(x, n_tok, cols, np, &mut s.pairs[..n_tok * np], |x, p| unsafe { avx512::quantize_pairs(x, p) });
                    &s.pairs[..n_tok * np]
                } else {
                    &[]
                };
                let q8: &[BlockQ8] = if ws.iter().any(|w| !pairs_for(w) && self.packed(w).is_none()) {
                    s.q8.resize(n_tok * nb, BlockQ8::default());
                    let q: fn(&[f32], &mut [BlockQ8]) = match self.simd {
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: `Avx512Vnni` is only set after detecting every feature
                        // `avx512::quantize_q8` enables.
                        SimdLevel::Avx512Vnni => |x, b| unsafe { avx512::quantize_q8(x, b) },
                        _ => quant::quantize_q8,
                    };
                    self.quantize(x, n_tok, cols, nb, &mut s.q8[..n_tok * nb], q);
                    &s.q8[..n_tok * nb]
                } else {
                    &[]
                };
                run(&|m, rows, out| {
                    #[cfg(target_arch = "x86_64")]
                    match self.packed(&ws[m]) {
                        // SAFETY: as for `quantize_q8o` above; `amx` is only set where
                        // `simd::amx_usable()` (AMX-INT8 with tile permission) is true.
                        Some(Packed::Q5_0(p)) if self.amx => return unsafe { amx::matmul_rows(p, rows, q8o, n_tok, out, x16::matmul_rows_q5_0) },
                        // SAFETY: as above.
                        Some(Packed::Q5_0(p)) => return unsafe { x16::matmul_rows_q5_0(p, rows, q8o, n_tok, out) },
                        // SAFETY: as above (AMX).
                        Some(Packed::Q4_0(p)) if self.amx => return unsafe { amx::matmul_rows(p, rows, q8o, n_tok, out, x16q::matmul_rows_q4_0) },
                        // SAFETY: as above (AMX).
                        Some(Packed::Q4_1(p)) if self.amx => return unsafe { amx::matmul_rows(p, rows, q8o, n_tok, out, x16q::matmul_rows_q4_1) },
                        // SAFETY: as above (AMX).
                        Some(Packed::Q8_0(p)) if self.amx => return unsafe { amx::matmul_rows(p, rows, q8o, n_tok, out, x16q::matmul_rows_q8_0) },
                        // SAFETY: as above.
                        Some(Packed::Q4_0(p)) => return unsafe { x16q::matmul_rows_q4_0(p, rows, q8o, n_tok, out) },
                        // SAFETY: as above.
                        Some(Packed::Q4_1(p)) => return unsafe { x16q::matmul_rows_q4_1(p, rows, q8o, n_tok, out) },
                        // SAFETY: as above.
                        Some(Packed::Q8_0(p)) => return unsafe { x16q::matmul_rows_q8_0(p, rows, q8o, n_tok, out) },
                        _ => {}
                    }
                    #[cfg(target_arch = "x86_64")]
                    if pairs_for(&ws[m]) {
                        // SAFETY: `SimdLevel::Avx512Vnni` is only set after detecting every feature
                        // `avx512::matmul_rows_q8` enables.
                        return unsafe { avx512::matmul_rows_q8(ws[m], rows, pairs, n_tok, out) };
                    }
                    self.rows_q8(ws[m], rows, q8, n_tok, out)
                });
            }
            ActFormat::Q8K => {
                let nb = cols / QK_K;
                let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                s.q8k.resize(n_tok * nb, BlockQ8K::default());
                let q: fn(&[f32], &mut [BlockQ8K]) = match self.simd {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Avx512Vnni` is only set after detecting every feature
                    // `avx512_k::quantize_q8k` enables.
                    SimdLevel::Avx512Vnni => |x, b| unsafe { avx512_k::quantize_q8k(x, b) },
                    _ => quant::quantize_q8k,
                };
                self.quantize(x, n_tok, cols, nb, &mut s.q8k[..n_tok * nb], q);
                let q8k = &s.q8k[..n_tok * nb];
                run(&|m, rows, out| match self.simd {
                    #[cfg(target_arch = "x86_64")]
                    SimdLevel::Avx512Vnni if matches!(self.packed(&ws[m]), Some(Packed::Q4K(_) | Packed::Q6K(_))) => match self.packed(&ws[m]) {
                        // SAFETY: `packed` is only `Some` at the `Avx512Vnni` level, set only
                        // after detecting every feature these kernels enable; `amx` only where
                        // `simd::amx_usable()` is true.
                        Some(Packed::Q4K(p)) if self.amx => unsafe { amx::matmul_rows(p, rows, q8k, n_tok, out, x16k::matmul_rows_q4k) },
                        // SAFETY: as above.
                        Some(Packed::Q6K(p)) if self.amx => unsafe { amx::matmul_rows(p, rows, q8k, n_tok, out, x16k::matmul_rows_q6k) },
                        // SAFETY: as above.
                        Some(Packed::Q4K(p)) => unsafe { x16k::matmul_rows_q4k(p, rows, q8k, n_tok, out) },
                        // SAFETY: as above.
                        Some(Packed::Q6K(p)) => unsafe { x16k::matmul_rows_q6k(p, rows, q8k, n_tok, out) },
                        _ => unreachable!("checked by the guard"),
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Avx512Vnni` is only set after detecting every feature
                    // `avx512_k::matmul_rows_q8k` enables.
                    SimdLevel::Avx512Vnni if avx2_k::Q8K_TYPES.contains(&ws[m].ty) => unsafe {
                        avx512_k::matmul_rows_q8k(ws[m], rows, q8k, n_tok, out)
                    },
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Avx2` is only set after detecting avx2, fma, f16c.
                    SimdLevel::Avx2 if avx2_k::Q8K_TYPES.contains(&ws[m].ty) => unsafe {
                        avx2_k::matmul_rows_q8k(ws[m], rows, q8k, n_tok, out)
                    },
                    #[cfg(target_arch = "aarch64")]
                    SimdLevel::Neon if neon::Q8K_TYPES.contains(&ws[m].ty) => neon::matmul_rows_q8k(ws[m], rows, q8k, n_tok, out),
                    _ => {
                        for t in 0..n_tok {
                            for r in rows.clone() {
                                out.write(t, r, quant::dot_q8k_scalar(ws[m].ty, ws[m].row(r), &q8k[t * nb..(t + 1) * nb]));
                            }
                        }
                    }
                });
            }
        }
    }

    /// Rows per dynamically scheduled chunk: enough chunks to balance the threads, enough rows
    /// that a chunk's weights are reused across all tokens while they sit in L1/L2. A
    /// matrix-vector product (decode: fewer tokens than a tile) reuses nothing, so a very tall
    /// matrix (Gemma's 262k-row output projection) gets longer chunks, about 64 per thread: each
    /// thread streams long contiguous runs (the prefetch ahead of a chunk's end is not wasted on
    /// rows another thread takes), with 64x fewer trips to the shared chunk counter.
    fn row_chunk(&self, rows: usize, n_tok: usize) -> usize {
        let chunk = (rows / (self.team.threads() * 4)).clamp(8, 64);
        if n_tok >= 4 {
            return chunk;
        }
        chunk.max(rows / (self.team.threads() * 64))
    }

    /// Quantizes `n_tok` activation rows of `cols` values in parallel over tokens.
    fn quantize<B: Send>(&self, x: &[f32], n_tok: usize, cols: usize, per_row: usize, dst: &mut [B], q: fn(&[f32], &mut [B])) {
        if n_tok == 1 {
            return q(x, dst);
        }
        let t = super::prof::start();
        let out = SharedSlice::new(dst);
        let out = &out;
        self.team.for_chunks(n_tok, 8, &|r| {
            for t in r {
                // SAFETY: token t's blocks are written by the one chunk that holds t.
                let d = unsafe { out.slice(t * per_row, per_row) };
                q(&x[t * cols..(t + 1) * cols], d);
            }
        });
        super::prof::stop(super::prof::Phase::Quantize, t);
    }

    /// Rows per chunk for `ws` (all of them in one region): `row_chunk` of their rows, whole
    /// groups of `x16::ROWS` where a matrix is repacked (a matrix's last chunk ends at its last
    /// row, which the kernels' padded last group allows).
    fn chunk_rows(&self, ws: &[WeightView<'_>], n_tok: usize) -> usize {
        let chunk = self.row_chunk(ws.iter().map(|w| w.rows).sum(), n_tok);
        if ws.iter().any(|w| self.packed(w).is_some()) {
            return chunk.next_multiple_of(x16::ROWS);
        }
        chunk
    }

    /// One parallel region over the rows of every matrix in `ws` (at most [`MAX_MULTI`]; chunks
    /// of [`CpuBackend::chunk_rows`] never span two matrices); `rows(m, range, out)` computes
    /// rows `range` of matrix m for every token into `outs[m]`. Chunks go out by home ranges
    /// (`Team::for_items_home`): each thread streams one contiguous run of the weights. Handed out
    /// from one shared counter, the threads took alternate chunks, so each one's reads jumped
    /// every few KiB and its prefetch ran into rows the other thread took: the worker's matmuls
    /// then ran at about half the caller's speed (`perf`), and decode was 20-30% slower.
    /// Allocates nothing.
    pub(super) fn rows_parallel(&self, ws: &[WeightView<'_>], n_tok: usize, outs: &[Option<SharedOut>; MAX_MULTI], rows: &RowsFn<'_>) {
        assert!(ws.len() <= MAX_MULTI);
        let chunk = self.chunk_rows(ws, n_tok);
        let total: usize = ws.iter().map(|w| w.rows.div_ceil(chunk)).sum();
        self.team.for_items_home(total, &|mut c| {
            // Map chunk c to (matrix, first row).
            let mut m = 0;
            while c >= ws[m].rows.div_ceil(chunk) {
                c -= ws[m].rows.div_ceil(chunk);
                m += 1;
            }
            if let Some(out) = &outs[m] {
                let r0 = c * chunk;
                rows(m, r0..(r0 + chunk).min(ws[m].rows), out);
            }
        });
    }

    /// One parallel region over matrices of the same rows (at most [`MAX_MULTI`]) whose chunks
    /// take the same rows of every matrix (as many as a chunk of one of them alone), then run
    /// `epi(range)` on them: an epilogue that needs only the rows its chunk computed (an
    /// activation, a residual add) runs on the thread that computed them, inside the region,
    /// instead of on the caller alone after it. Chunks go out by home ranges, as in
    /// [`CpuBackend::rows_parallel`].
    fn rows_fused(&self, ws: &[WeightView<'_>], n_tok: usize, outs: &[&SharedOut], rows: &RowsFn<'_>, epi: &(dyn Fn(Range<usize>) + Sync)) {
        let r = ws[0].rows;
        assert!(ws.len() == outs.len() && ws.iter().all(|w| w.rows == r));
        let chunk = self.chunk_rows(&ws[..1], n_tok);
        self.team.for_items_home(r.div_ceil(chunk), &|c| {
            let rr = c * chunk..((c + 1) * chunk).min(r);
            for (m, out) in outs.iter().enumerate() {
                rows(m, rr.clone(), out);
            }
            epi(rr);
        });
    }

    /// [`Backend::matmul_gated`] on the CPU: one region whose chunks compute rows of gate and up
    /// and then the activation of those rows (elementwise, so the same bits as after the region).
    pub(super) fn gated(&self, ws: [WeightView<'_>; 2], x: &[f32], n_tok: usize, act: FfnActivation, gate: &mut [f32], up: &mut [f32]) {
        let r = ws[0].rows;
        if ws[1].rows != r || ws[1].cols != ws[0].cols || act_format(ws[1].ty) != act_format(ws[0].ty) {
            self.matmul_multi(&ws, x, n_tok, &mut [&mut *gate, &mut *up]);
            return self.gated_act(act, gate, up);
        }
        assert!(gate.len() == n_tok * r && up.len() == n_tok * r, "matmul_gated: outputs are not [n_tok, rows]");
        let (g, u) = (SharedOut::new(gate, r), SharedOut::new(up, r));
        self.with_kernel(&ws, x, n_tok, &mut |k| {
            self.rows_fused(&ws, n_tok, &[&g, &u], k, &|rr| {
                for t in 0..n_tok {
                    // SAFETY: rows `rr` of every token are this chunk's alone; its kernels have
                    // finished writing them.
                    let (gs, us) = unsafe { (g.run_mut(t, rr.clone()), u.run_mut(t, rr.clone())) };
                    self.gated_act_run(act, gs, us);
                }
            })
        });
    }

    /// gate = act(gate) · up over one run of rows, on this thread: `silu_mul` (elementwise), or
    /// the GeGLU kernel of `gelu_tanh_mul` (its lanes are independent: the same bits in any run).
    fn gated_act_run(&self, act: FfnActivation, gate: &mut [f32], up: &[f32]) {
        let t = super::prof::start();
        match act {
            FfnActivation::Silu => self.silu_mul(gate, up),
            FfnActivation::GeluTanh => self.gelu_tanh_mul_block(gate, up),
        }
        super::prof::stop(super::prof::Phase::ActThreads, t);
    }

    /// [`Backend::matmul_add`] on the CPU: one region whose chunks compute rows of `w · a` into
    /// `proj` and add them to `x` (the same `x += proj` as `add` after the region).
    pub(super) fn residual(&self, w: WeightView<'_>, a: &[f32], n_tok: usize, proj: &mut [f32], x: &mut [f32]) {
        let r = w.rows;
        assert!(proj.len() == n_tok * r && x.len() == n_tok * r, "matmul_add: proj and x are not [n_tok, rows]");
        let (p, xs) = (SharedOut::new(proj, r), SharedOut::new(x, r));
        let ws = [w];
        self.with_kernel(&ws, a, n_tok, &mut |k| {
            self.rows_fused(&ws, n_tok, &[&p], k, &|rr| {
                for t in 0..n_tok {
                    // SAFETY: rows `rr` of every token are this chunk's alone (in `proj` and `x`).
                    let (ps, xr) = unsafe { (p.run_mut(t, rr.clone()), xs.run_mut(t, rr.clone())) };
                    self.add(xr, ps);
                }
            })
        });
    }
}
