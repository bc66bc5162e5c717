//! CPU backend: a rayon pool of its own (sized by `--threads`, never the global pool, so it does
//! not oversubscribe tokio's threads), the scalar reference kernels, and SIMD kernels chosen once
//! at construction from the CPU's features.
//!
//! Parallelism never changes arithmetic: matmul splits output rows between threads and each
//! (row, token) dot product is computed by one thread with one fixed reduction order; attention
//! splits (token, head) pairs. That is what makes results batch invariant.

pub mod ops;
pub mod quant;

#[cfg(target_arch = "x86_64")]
mod avx2;

use std::sync::Mutex;

use half::f16;
use rayon::prelude::*;

use self::quant::{act_format, ActFormat, BlockQ8, BlockQ8K};
use super::{AttentionArgs, Backend, Op, WeightView};
use crate::gguf::{GgmlType, QK, QK_K};

/// Instruction-set level of the CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable reference kernels.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
}

impl SimdLevel {
    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
                return SimdLevel::Avx2;
            }
        }
        SimdLevel::Scalar
    }

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
        }
    }
}

#[derive(Default)]
struct Scratch {
    /// [n_tok, cols / 32]
    q8: Vec<BlockQ8>,
    /// [n_tok, cols / 256]
    q8k: Vec<BlockQ8K>,
}

pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    simd: SimdLevel,
    scratch: Mutex<Scratch>,
}

/// Output pointer shared by the row-parallel matmul: each thread writes a disjoint set of rows.
struct RowsOut {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: threads write disjoint indices (disjoint row chunks), and the buffer outlives the
// parallel region that uses it (it is borrowed mutably for the whole call).
unsafe impl Sync for RowsOut {}

impl RowsOut {
    #[inline]
    fn write(&self, i: usize, v: f32) {
        assert!(i < self.len);
        // SAFETY: in bounds (asserted); no other thread writes index i (see the Sync impl).
        unsafe { *self.ptr.add(i) = v }
    }
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0 = one per physical core) at the best SIMD level.
    pub fn new(threads: usize) -> Result<CpuBackend, rayon::ThreadPoolBuildError> {
        Self::with_simd(threads, SimdLevel::detect())
    }

    /// Forces a SIMD level (`Scalar` runs the reference kernels everywhere). Asking for a level
    /// the CPU lacks falls back to `Scalar`.
    pub fn with_simd(threads: usize, simd: SimdLevel) -> Result<CpuBackend, rayon::ThreadPoolBuildError> {
        let threads = if threads == 0 { super::hardware::physical_cores() } else { threads };
        let simd = if simd == SimdLevel::Avx2 && SimdLevel::detect() != SimdLevel::Avx2 { SimdLevel::Scalar } else { simd };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("forge-cpu-{i}"))
            .build()?;
        Ok(CpuBackend { pool, threads, simd, scratch: Mutex::new(Scratch::default()) })
    }

    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` inside this backend's pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn dot_q8(&self, ty: GgmlType, w: &[u8], x: &[BlockQ8]) -> f32 {
        match self.simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `SimdLevel::Avx2` is only set after detecting avx2, fma and f16c.
            SimdLevel::Avx2 => unsafe {
                match ty {
                    GgmlType::Q4_0 => avx2::dot_q4_0(w, x),
                    GgmlType::Q4_1 => avx2::dot_q4_1(w, x),
                    _ => avx2::dot_q8_0(w, x),
                }
            },
            _ => quant::dot_q8_scalar(ty, w, x),
        }
    }

    fn dot_float(&self, ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
        match (self.simd, ty) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `SimdLevel::Avx2` is only set after detecting avx2, fma and f16c.
            (SimdLevel::Avx2, GgmlType::F32) => unsafe { avx2::dot_f32(w, x) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            (SimdLevel::Avx2, GgmlType::F16) => unsafe { avx2::dot_f16(w, x) },
            _ => quant::dot_float_scalar(ty, w, x),
        }
    }

    /// Rows per parallel task: enough tasks to balance, few enough to amortize scheduling.
    fn row_chunk(&self, rows: usize) -> usize {
        (rows / (self.threads * 8)).clamp(4, 256)
    }

    /// The parallel driver: `out[t, r] = dot(row r, activation t)`.
    fn rows_parallel(&self, rows: usize, n_tok: usize, out: &mut [f32], dot: impl Fn(usize, usize) -> f32 + Sync) {
        let out = RowsOut { ptr: out.as_mut_ptr(), len: out.len() };
        let chunk = self.row_chunk(rows);
        self.pool.install(|| {
            (0..rows.div_ceil(chunk)).into_par_iter().for_each(|c| {
                for r in c * chunk..((c + 1) * chunk).min(rows) {
                    for t in 0..n_tok {
                        out.write(t * rows + r, dot(r, t));
                    }
                }
            })
        });
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu-{} ({} threads)", self.simd.name(), self.threads)
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::MatMul | Op::Embed => true,
            // Activations are f32 on the CPU.
            _ => ty == GgmlType::F32,
        }
    }

    fn matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
        let (rows, cols) = (w.rows, w.cols);
        assert_eq!(x.len(), n_tok * cols, "matmul: x is not [n_tok, cols]");
        assert_eq!(out.len(), n_tok * rows, "matmul: out is not [n_tok, rows]");
        match act_format(w.ty) {
            ActFormat::F32 => self.rows_parallel(rows, n_tok, out, |r, t| self.dot_float(w.ty, w.row(r), &x[t * cols..(t + 1) * cols])),
            ActFormat::Q8 => {
                let nb = cols / QK;
                let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                s.q8.resize(n_tok * nb, BlockQ8::default());
                let q8 = &mut s.q8[..n_tok * nb];
                self.pool.install(|| {
                    q8.par_chunks_mut(nb).zip(x.par_chunks(cols)).for_each(|(q, xs)| quant::quantize_q8(xs, q))
                });
                let q8 = &*q8;
                self.rows_parallel(rows, n_tok, out, |r, t| self.dot_q8(w.ty, w.row(r), &q8[t * nb..(t + 1) * nb]));
            }
            ActFormat::Q8K => {
                let nb = cols / QK_K;
                let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
                s.q8k.resize(n_tok * nb, BlockQ8K::default());
                let q8k = &mut s.q8k[..n_tok * nb];
                self.pool.install(|| {
                    q8k.par_chunks_mut(nb).zip(x.par_chunks(cols)).for_each(|(q, xs)| quant::quantize_q8k(xs, q))
                });
                let q8k = &*q8k;
                self.rows_parallel(rows, n_tok, out, |r, t| quant::dot_q8k_scalar(w.ty, w.row(r), &q8k[t * nb..(t + 1) * nb]));
            }
        }
    }

    fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        for (o, xs) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::rmsnorm(xs, weight, eps, o);
        }
    }

    fn layernorm(&self, x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        for (o, xs) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::layernorm(xs, weight, bias, eps, o);
        }
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) {
        for (tok, &pos) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
            let cs = &cos_sin[pos as usize * head_dim..(pos as usize + 1) * head_dim];
            for h in tok.chunks_exact_mut(head_dim) {
                ops::rope_head(h, cs);
            }
        }
    }

    fn attention(&self, a: AttentionArgs<'_>) {
        let (hd, n_head, cap) = (a.head_dim, a.n_head, a.capacity);
        let group = n_head / a.n_kv_head;
        let scale = 1.0 / (hd as f32).sqrt();
        let (q, k, v, positions) = (a.q, a.k_cache, a.v_cache, a.positions);
        let simd = self.simd;
        self.pool.install(|| {
            a.out.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
                let (t, h) = (i / n_head, i % n_head);
                let kvh = h / group;
                let n_keys = positions[t] as usize + 1;
                let qh = &q[i * hd..(i + 1) * hd];
                let keys = &k[kvh * cap * hd..(kvh * cap + n_keys) * hd];
                let vals = &v[kvh * cap * hd..(kvh * cap + n_keys) * hd];
                attend(simd, qh, keys, vals, n_keys, scale, out);
            })
        });
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = ops::silu(*g) * u;
        }
    }

    fn gelu(&self, x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = ops::gelu(*v);
        }
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// One head's attention at the chosen SIMD level (same tiling and key order at every level).
fn attend(simd: SimdLevel, q: &[f32], keys: &[f16], vals: &[f16], n_keys: usize, scale: f32, out: &mut [f32]) {
    match simd {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if q.len() % 8 == 0 => ops::attend_head_with(
            q,
            keys,
            vals,
            n_keys,
            scale,
            out,
            // SAFETY (both closures): only reached at SimdLevel::Avx2, set after feature detection.
            |q, k| unsafe { avx2::dot_f32_f16(q, k) },
            |o, e, v| unsafe { avx2::axpy_f16(o, e, v) },
        ),
        _ => ops::attend_head(q, keys, vals, n_keys, scale, out),
    }
}

#[cfg(test)]
mod testutil;
#[cfg(test)]
mod tests;
