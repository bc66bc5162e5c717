//! CPU backend: a thread team of its own (`team.rs`, sized by `--threads`, default physical
//! cores; nothing is shared with tokio's threads), the scalar reference kernels, and SIMD kernels
//! chosen once at construction from the CPU's features.
//!
//! Parallelism never changes arithmetic: matmul splits output rows between threads and each
//! (row, token) dot product is computed by one thread with one fixed reduction order (token
//! tiles share weight unpacking, never accumulators); attention splits (token, head) pairs.
//! That is what makes results batch invariant.

pub mod blocks;
pub mod f32mm;
mod matmul;
pub mod ops;
pub mod prof;
pub mod quant;
pub mod quant_k;
mod shared;
pub mod team;
pub mod x16;
pub mod x16k;
pub mod x16q;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod attn512;
#[cfg(target_arch = "x86_64")]
mod attn512q;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_k;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_k;
#[cfg(target_arch = "x86_64")]
mod vexp;
#[cfg(target_arch = "aarch64")]
mod neon;

use std::sync::Mutex;

use half::f16;

use self::quant::{act_format, BlockQ8, BlockQ8K};
use self::shared::{SharedOut, SharedSlice};
use self::team::Team;
pub use super::simd::SimdLevel;
use super::offload::FfnActivation;
use super::{attention_keys, dequantize_rows_in_order, AttentionArgs, Backend, Op, Prepared, WeightView};
use crate::gguf::GgmlType;

/// Quantized activations of the current matmul, reused across calls (no allocation once warm).
#[derive(Default)]
struct Scratch {
    /// [n_tok, cols / 32]
    q8: Vec<BlockQ8>,
    /// [n_tok, cols / 256]
    q8k: Vec<BlockQ8K>,
    /// [n_tok, (cols / 32).div_ceil(2)] (the AVX-512 layout of `q8`)
    #[cfg(target_arch = "x86_64")]
    pairs: Vec<avx512::PairQ8>,
    /// [n_tok, cols / 32] (what the repacked kernels of `x16` read)
    #[cfg(target_arch = "x86_64")]
    q8o: Vec<x16::BlockQ8O>,
    /// segmented attention: unnormalized outputs [n_tok, n_kv_head, segments, group * head_dim]
    att: Vec<f32>,
    /// segmented attention: (max, sum) per query head [n_tok, n_kv_head, segments, group, 2]
    att_ml: Vec<f32>,
}

pub struct CpuBackend {
    team: Team,
    simd: SimdLevel,
    /// prefill of repacked matrices on AMX-INT8 tiles (`amx`; `simd::amx_status` says why not)
    amx: bool,
    scratch: Mutex<Scratch>,
}

impl CpuBackend {
    /// A backend with `threads` threads (0 = one per physical core) at the best SIMD level, or
    /// at the level named by the `FORGE_SIMD` environment variable (`scalar`, `avx2`,
    /// `avx512vnni`, `neon`: for comparing levels with one binary).
    pub fn new(threads: usize) -> std::io::Result<CpuBackend> {
        let forced = std::env::var("FORGE_SIMD").ok().and_then(|n| SimdLevel::from_name(&n));
        Self::with_simd(threads, forced.unwrap_or_else(SimdLevel::detect))
    }

    /// Forces a SIMD level (`Scalar` runs the reference kernels everywhere). Asking for a level
    /// the CPU lacks falls back to `Scalar`.
    pub fn with_simd(threads: usize, simd: SimdLevel) -> std::io::Result<CpuBackend> {
        let threads = if threads == 0 { super::hardware::physical_cores() } else { threads };
        let simd = if simd.supported() { simd } else { SimdLevel::Scalar };
        let amx = simd == SimdLevel::Avx512Vnni && super::simd::amx_usable();
        Ok(CpuBackend { team: Team::new(threads)?, simd, amx, scratch: Mutex::new(Scratch::default()) })
    }

    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    /// Whether prefill of repacked matrices runs on AMX-INT8 tiles.
    pub fn amx(&self) -> bool {
        self.amx
    }

    pub fn threads(&self) -> usize {
        self.team.threads()
    }

    /// Measured memory read bandwidth (bytes/s) of this backend's threads over `buf`, best of
    /// `reps` passes: the decode floor is model bytes / this.
    pub fn read_bandwidth(&self, buf: &[u64], reps: usize) -> f64 {
        let chunk = (buf.len() / (self.team.threads() * 16)).max(1 << 12);
        let mut best = 0f64;
        for _ in 0..reps.max(1) {
            let total = std::sync::atomic::AtomicU64::new(0);
            let t = std::time::Instant::now();
            self.team.for_chunks(buf.len(), chunk, &|r| {
                let s = buf[r].iter().fold(0u64, |a, &b| a.wrapping_add(b));
                total.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
            });
            std::hint::black_box(total.load(std::sync::atomic::Ordering::Relaxed));
            best = best.max(std::mem::size_of_val(buf) as f64 / t.elapsed().as_secs_f64());
        }
        best
    }

    /// Rows of a matrix of a 32-element block type against quantized activations, at this SIMD
    /// level (the scalar reference for types a level has no kernel for).
    fn rows_q8(&self, w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
        match self.simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `SimdLevel::Avx512Vnni` is only set after detecting every feature
            // `avx512::matmul_rows_q8_0` enables.
            SimdLevel::Avx512Vnni if w.ty == GgmlType::Q8_0 => unsafe { avx512::matmul_rows_q8_0(w, rows, acts, n_tok, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: both levels are only set after detecting avx2, fma, f16c.
            SimdLevel::Avx2 | SimdLevel::Avx512Vnni if avx2::Q8_TYPES.contains(&w.ty) => unsafe { avx2::matmul_rows_q8(w, rows, acts, n_tok, out) },
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon if neon::Q8_TYPES.contains(&w.ty) => neon::matmul_rows_q8(w, rows, acts, n_tok, out),
            _ => quant::matmul_rows_q8_scalar(w, rows, acts, n_tok, out),
        }
    }

    /// `w`'s rows repacked for this level's kernels (`x16`, `x16k`), if `prepare` made them.
    fn packed<'a>(&self, w: &WeightView<'a>) -> Option<Packed<'a>> {
        if self.simd != SimdLevel::Avx512Vnni {
            return None;
        }
        let data: &'a (dyn std::any::Any + Send + Sync) = &*w.prepared?.data;
        // one downcast, chosen by the view's type (this runs on every matmul call)
        fn of<'a, B: x16::Block16 + 'static>(data: &'a (dyn std::any::Any + Send + Sync), w: &WeightView<'_>) -> Option<&'a x16::Packed16<B>> {
            data.downcast_ref::<x16::Packed16<B>>().filter(|p| p.rows == w.rows && p.cols == w.cols)
        }
        Some(match w.ty {
            GgmlType::Q5_0 => Packed::Q5_0(of(data, w)?),
            GgmlType::Q4_0 => Packed::Q4_0(of(data, w)?),
            GgmlType::Q4_1 => Packed::Q4_1(of(data, w)?),
            GgmlType::Q8_0 => Packed::Q8_0(of(data, w)?),
            GgmlType::Q4K => Packed::Q4K(of(data, w)?),
            GgmlType::Q6K => Packed::Q6K(of(data, w)?),
            _ => return None,
        })
    }

    /// Whether the AVX-512 level has a pair kernel for `ty` (never on other architectures).
    fn has_pair_kernel(ty: GgmlType) -> bool {
        #[cfg(target_arch = "x86_64")]
        return avx512::PAIR_TYPES.contains(&ty);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = ty;
            false
        }
    }

}

/// A matrix repacked for the AVX-512 level's interleaved kernels (x86-64 only reads them).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Packed<'a> {
    Q5_0(&'a x16::PackedQ5x16),
    Q4_0(&'a x16q::PackedQ40x16),
    Q4_1(&'a x16q::PackedQ41x16),
    Q8_0(&'a x16q::PackedQ80x16),
    Q4K(&'a x16k::PackedQ4Kx16),
    Q6K(&'a x16k::PackedQ6Kx16),
}

/// Most matrices one `matmul_multi` region takes (Q, K, V); longer lists are split.
const MAX_MULTI: usize = 3;

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu-{}{} ({} threads)", self.simd.name(), if self.amx { "+amx" } else { "" }, self.team.threads())
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::MatMul | Op::Embed => true,
            // Activations are f32 on the CPU.
            _ => ty == GgmlType::F32,
        }
    }

    /// At the AVX-512 level, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K matrices are repacked 16 rows
    /// at a time (`x16`, `x16q`, `x16k`: as many bytes as the tensor with its rows rounded up to
    /// 16, +8% for Q4_K, +30% for Q6_K; results bitwise the scalar reference's).
    fn prepare(&self, w: WeightView<'_>) -> Option<Prepared> {
        if self.simd != SimdLevel::Avx512Vnni {
            return None;
        }
        fn repack<B: x16::Block16 + Send + Sync + 'static>(w: &WeightView<'_>) -> Option<Prepared> {
            let p = x16::Packed16::<B>::new(w);
            Some(Prepared { bytes: p.bytes(), data: Box::new(p) })
        }
        match w.ty {
            GgmlType::Q5_0 if x16::PackedQ5x16::fits(&w) => repack::<x16::BlockQ5x16>(&w),
            GgmlType::Q4_0 if x16q::PackedQ40x16::fits(&w) => repack::<x16q::BlockQ40x16>(&w),
            GgmlType::Q4_1 if x16q::PackedQ41x16::fits(&w) => repack::<x16q::BlockQ41x16>(&w),
            GgmlType::Q8_0 if x16q::PackedQ80x16::fits(&w) => repack::<x16q::BlockQ80x16>(&w),
            GgmlType::Q4K if x16k::PackedQ4Kx16::fits(&w) => repack::<x16k::BlockQ4Kx16>(&w),
            GgmlType::Q6K if x16k::PackedQ6Kx16::fits(&w) => repack::<x16k::BlockQ6Kx16>(&w),
            _ => None,
        }
    }

    fn matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
        self.matmul_multi(&[w], x, n_tok, &mut [out]);
    }

    /// One parallel region: each chunk of rows of gate and up, then their activation.
    fn matmul_gated(&self, gate_w: WeightView<'_>, up_w: WeightView<'_>, x: &[f32], n_tok: usize, act: FfnActivation, gate: &mut [f32], up: &mut [f32]) {
        let t = prof::start();
        self.gated([gate_w, up_w], x, n_tok, act, gate, up);
        prof::stop(prof::Phase::Gated, t);
    }

    /// One parallel region: each chunk of rows, then its residual add.
    fn matmul_add(&self, w: WeightView<'_>, a: &[f32], n_tok: usize, proj: &mut [f32], x: &mut [f32]) {
        let t = prof::start();
        self.residual(w, a, n_tok, proj, x);
        prof::stop(prof::Phase::Residual, t);
    }

    fn matmul_multi(&self, ws: &[WeightView<'_>], x: &[f32], n_tok: usize, outs: &mut [&mut [f32]]) {
        let Some(first) = ws.first() else { return };
        let (cols, fmt) = (first.cols, act_format(first.ty));
        if ws.len() > MAX_MULTI || ws.iter().any(|w| w.cols != cols || act_format(w.ty) != fmt) {
            // Different inputs or activation formats: one matrix at a time.
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                self.matmul_multi(std::slice::from_ref(w), x, n_tok, std::slice::from_mut(o));
            }
            return;
        }
        for (w, o) in ws.iter().zip(outs.iter()) {
            assert_eq!(o.len(), n_tok * w.rows, "matmul: out is not [n_tok, rows]");
        }
        let mut it = outs.iter_mut().zip(ws);
        let shared: [Option<SharedOut>; MAX_MULTI] = std::array::from_fn(|_| it.next().map(|(o, w)| SharedOut::new(o, w.rows)));
        let t = prof::start();
        self.with_kernel(ws, x, n_tok, &mut |rows| self.rows_parallel(ws, n_tok, &shared, rows));
        prof::stop(prof::Phase::Matmul, t);
    }

    /// Rows split over the team in chunks of 16 (a row's arithmetic is the same in any chunk).
    fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let t = prof::start();
        self.rmsnorm_rows(x, weight, eps, out);
        prof::stop(prof::Phase::Norm, t);
    }

    fn layernorm(&self, x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        for (o, xs) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)) {
            ops::layernorm(xs, weight, bias, eps, o);
        }
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) {
        let t = prof::start();
        let w = n_head * head_dim;
        let rows = |x: &mut [f32], positions: &[u32]| {
            for (tok, &pos) in x.chunks_exact_mut(w).zip(positions) {
                let cs = &cos_sin[pos as usize * head_dim..(pos as usize + 1) * head_dim];
                for h in tok.chunks_exact_mut(head_dim) {
                    ops::rope_head(h, cs);
                }
            }
        };
        let n = positions.len().min(x.len() / w.max(1));
        if n < 2 * ROPE_ROWS || self.team.threads() == 1 {
            rows(x, positions);
        } else {
            // Tokens split over the team (each token's rotation is the same in any chunk).
            let shared = SharedSlice::new(&mut x[..n * w]);
            let shared = &shared;
            self.team.for_chunks(n, ROPE_ROWS, &|r| {
                // SAFETY: token ranges are disjoint; each is handed to one thread.
                rows(unsafe { shared.slice(r.start * w, r.len() * w) }, &positions[r]);
            });
        }
        prof::stop(prof::Phase::Rope, t);
    }

    fn attention(&self, a: AttentionArgs<'_>) {
        let t = prof::start();
        self.attention_all(a);
        prof::stop(prof::Phase::Attention, t);
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.simd == SimdLevel::Avx512Vnni {
            // SAFETY: `Avx512Vnni` is only set after detecting AVX-512F (and avx2, fma).
            return unsafe { vexp::silu_mul(gate, up) };
        }
        for (g, u) in gate.iter_mut().zip(up) {
            *g = ops::silu(*g) * u;
        }
    }

    /// Split over the team in blocks of `GELU_BLOCK` (each element's arithmetic is the same in
    /// any block: the SIMD kernel's lanes are independent and its tail is padded).
    fn gelu_tanh_mul(&self, gate: &mut [f32], up: &[f32]) {
        let n = gate.len();
        if self.team.threads() > 1 && n >= 2 * GELU_BLOCK {
            let shared = SharedSlice::new(gate);
            let shared = &shared;
            return self.team.for_chunks(n.div_ceil(GELU_BLOCK), 1, &|blocks| {
                let (a, b) = (blocks.start * GELU_BLOCK, (blocks.end * GELU_BLOCK).min(n));
                // SAFETY: block ranges are disjoint; each is handed to one thread.
                self.gelu_tanh_mul_block(unsafe { shared.slice(a, b - a) }, &up[a..b]);
            });
        }
        self.gelu_tanh_mul_block(gate, up)
    }

    fn gelu(&self, x: &mut [f32]) {
        // Element-wise, so split over the team in blocks of GELU_BLOCK (a multiple of the SIMD
        // kernel's 4 lanes: every element goes through the same arithmetic, whatever the split).
        if self.team.threads() == 1 || x.len() < 2 * GELU_BLOCK {
            return self.gelu_block(x);
        }
        let n = x.len();
        let shared = SharedSlice::new(x);
        let shared = &shared;
        self.team.for_chunks(n.div_ceil(GELU_BLOCK), 1, &|blocks| {
            let (a, b) = (blocks.start * GELU_BLOCK, (blocks.end * GELU_BLOCK).min(n));
            // SAFETY: block ranges are disjoint; each is handed to one thread.
            self.gelu_block(unsafe { shared.slice(a, b - a) });
        });
    }

    /// Split over the team in runs of [`EMBED_ROWS`] rows (a prefill's embedding was one
    /// thread's serial loop: ~1 ms for 512 rows of 2048 Q4_0 values on one Zen 3 core).
    fn dequantize_rows(&self, table: WeightView<'_>, ids: &[u32], out: &mut [f32]) {
        if self.team.threads() == 1 || ids.len() < 2 * EMBED_ROWS {
            return dequantize_rows_in_order(table, ids, out);
        }
        let cols = table.cols;
        let shared = SharedSlice::new(out);
        let shared = &shared;
        self.team.for_chunks(ids.len(), EMBED_ROWS, &|r| {
            // SAFETY: row runs are disjoint; each is handed to one thread.
            dequantize_rows_in_order(table, &ids[r.clone()], unsafe { shared.slice(r.start * cols, r.len() * cols) });
        });
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
    }
}

/// Elements per parallel GELU work item (a multiple of 4).
const GELU_BLOCK: usize = 2048;
/// Rows per parallel run of [`Backend::dequantize_rows`].
const EMBED_ROWS: usize = 16;

/// Rows per parallel RMSNorm work item.
const NORM_ROWS: usize = 16;

/// Tokens per parallel RoPE work item.
const ROPE_ROWS: usize = 32;

impl CpuBackend {
    /// [`Backend::rmsnorm`]: rows split over the team in chunks of 16 (a row's arithmetic is the
    /// same in any chunk).
    fn rmsnorm_rows(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        let d = weight.len();
        let n = x.len() / d;
        if n < 2 * NORM_ROWS || self.team.threads() == 1 {
            return ops::rmsnorm_rows(&x[..n * d], weight, eps, &mut out[..n * d]);
        }
        let shared = SharedSlice::new(&mut out[..n * d]);
        let shared = &shared;
        self.team.for_chunks(n, NORM_ROWS, &|rows| {
            // SAFETY: row ranges are disjoint; each is handed to one thread.
            let o = unsafe { shared.slice(rows.start * d, rows.len() * d) };
            ops::rmsnorm_rows(&x[rows.start * d..rows.end * d], weight, eps, o);
        });
    }


    /// [`Backend::attention`].
    fn attention_all(&self, a: AttentionArgs<'_>) {
        let (hd, n_head, cap) = (a.head_dim, a.n_head, a.capacity);
        let group = n_head / a.n_kv_head;
        let scale = 1.0 / (hd as f32).sqrt();
        let (q, k, v, positions, window) = (a.q, a.k_cache, a.v_cache, a.positions, a.window);
        #[cfg(target_arch = "x86_64")]
        if range_kernel(self.simd, hd, group).is_some() {
            let n_seg = positions.iter().map(|&p| attention_keys(p, window).len().div_ceil(ops::ATT_SEG)).max().unwrap_or(1);
            // Several tokens at the AVX-512 level: blocks of them share K/V tiles (`attn512q::attend_lanes`).
            if n_seg > 1 || (positions.len() > 1 && rows_kernel(self.simd, hd, group)) {
                return self.attention_segmented(a, n_seg);
            }
        }
        // Work items: (token, KV head); the group's query heads are contiguous in q and out.
        let n_items = positions.len() * a.n_kv_head;
        let gw = group * hd;
        let out = SharedSlice::new(a.out);
        let out = &out;
        let simd = self.simd;
        self.team.for_chunks(n_items, 1, &|range| {
            for i in range {
                let (t, kvh) = (i / a.n_kv_head, i % a.n_kv_head);
                // The query's keys (a window of them for sliding-window layers), from the first.
                let r = attention_keys(positions[t], window);
                let n_keys = r.len();
                let (k0, k1) = ((kvh * cap + r.start) * hd, (kvh * cap + r.end) * hd);
                let (keys, vals) = (&k[k0..k1], &v[k0..k1]);
                let qg = &q[i * gw..(i + 1) * gw];
                // SAFETY: item i owns out[i*gw..(i+1)*gw]; items are disjoint across chunks.
                let o = unsafe { out.slice(i * gw, gw) };
                attend(simd, qg, keys, vals, n_keys, hd, scale, o);
            }
        });
    }

    fn gelu_tanh_mul_block(&self, gate: &mut [f32], up: &[f32]) {
        match self.simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512Vnni` are only set after detecting avx2 and fma.
            SimdLevel::Avx2 | SimdLevel::Avx512Vnni => unsafe { avx2::gelu_tanh_mul(gate, up) },
            _ => {
                for (g, u) in gate.iter_mut().zip(up) {
                    *g = ops::gelu_tanh(*g) * u;
                }
            }
        }
    }

    fn gelu_block(&self, x: &mut [f32]) {
        match self.simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` and `Avx512Vnni` are only set after detecting avx2 and fma.
            SimdLevel::Avx2 | SimdLevel::Avx512Vnni => unsafe { avx2::gelu(x) },
            _ => {
                for v in x.iter_mut() {
                    *v = ops::gelu(*v);
                }
            }
        }
    }

    /// Attention when some query sees more than one `ops::ATT_SEG` of keys (x86 SIMD levels), or
    /// of several tokens at the AVX-512 level: work items (KV head, segment, block of tokens),
    /// then a merge of each query's segments in order. A query with a single segment is computed
    /// whole, exactly as by `attend`. At the AVX-512 level the tokens of a block that need the
    /// segment go through `attn512q::attend_lanes` together (their query heads in the lanes, one
    /// conversion and load of each K/V tile for all of them; `attn512::attend_rows` where they
    /// fill less than a register), which gives each token the arithmetic of its own call.
    #[cfg(target_arch = "x86_64")]
    fn attention_segmented(&self, a: AttentionArgs<'_>, n_seg: usize) {
        const SEG: usize = ops::ATT_SEG;
        let (hd, n_kv, cap, positions) = (a.head_dim, a.n_kv_head, a.capacity, a.positions);
        let group = a.n_head / n_kv;
        let gw = group * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let n_tok = positions.len();
        let Some(kernel) = range_kernel(self.simd, hd, group) else { unreachable!("attention_segmented without a range kernel") };
        let block = if rows_kernel(self.simd, hd, group) { attn512q::max_rows(hd, group) } else { 1 };
        let n_blocks = n_tok.div_ceil(block);
        let n_items = n_kv * n_seg * n_blocks;
        let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = &mut *s;
        // Sized for the whole cache the first time, so decode does not grow it step by step.
        let per_tok = n_kv * cap.div_ceil(SEG).max(n_seg);
        s.att.resize((positions.len() * per_tok * gw).max(s.att.len()), 0.0);
        s.att_ml.resize((positions.len() * per_tok * 2 * group).max(s.att_ml.len()), 0.0);
        let (part, ml) = (SharedSlice::new(&mut s.att), SharedSlice::new(&mut s.att_ml));
        let out = SharedSlice::new(a.out);
        let (part, ml, out) = (&part, &ml, &out);
        let window = a.window;
        // Segments at positions relative to the query's first key (a function of its position).
        let segs = |t: usize| attention_keys(positions[t], window).len().div_ceil(SEG);
        // Items in (KV head, segment, token block) order: consecutive items read the same segment
        // of K and V (up to 128 KiB at head_dim 64), which stays in the core's L2 across the
        // tokens of a prefill batch. Neither the order nor the blocks change arithmetic: a
        // token's result depends on its own (token, head, segment) only, and lands in its own
        // slot `tk * n_seg + seg`.
        self.team.for_chunks(n_items, 1, &|range| {
            for item in range {
                let (hs, blk) = (item / n_blocks, item % n_blocks);
                let (kvh, seg) = (hs / n_seg, hs % n_seg);
                let mut rows: [attn512::Row<'_>; attn512q::MAX_ROWS] = std::array::from_fn(|_| attn512::Row { q: &[], end: 0, out: &mut [], ml: None });
                let mut toks = [0usize; attn512q::MAX_ROWS];
                let (mut n_rows, mut first_key, mut last_key, mut same_start) = (0, None, 0, true);
                for t in blk * block..((blk + 1) * block).min(n_tok) {
                    if seg >= segs(t) {
                        continue;
                    }
                    let tk = t * n_kv + kvh;
                    let i = tk * n_seg + seg;
                    let r = attention_keys(positions[t], window);
                    let qg = &a.q[tk * gw..(tk + 1) * gw];
                    let row = if segs(t) == 1 {
                        // SAFETY: a query of one segment has one item (seg 0), which alone writes
                        // out[tk*gw..]; items are disjoint.
                        attn512::Row { q: qg, end: r.len(), out: unsafe { out.slice(tk * gw, gw) }, ml: None }
                    } else {
                        // SAFETY: item (kvh, seg, blk) alone owns part[i*gw..][..gw] and ml[i*2g..][..2g].
                        let (o, m) = unsafe { (part.slice(i * gw, gw), ml.slice(i * 2 * group, 2 * group)) };
                        attn512::Row { q: qg, end: ((seg + 1) * SEG).min(r.len()), out: o, ml: Some(m) }
                    };
                    same_start &= *first_key.get_or_insert(r.start) == r.start;
                    last_key = last_key.max(r.start + row.end);
                    rows[n_rows] = row;
                    toks[n_rows] = t;
                    n_rows += 1;
                }
                let Some(first_key) = first_key else { continue };
                if block > 1 && same_start {
                    let (k0, k1) = ((kvh * cap + first_key) * hd, (kvh * cap + last_key) * hd);
                    let (keys, vals) = (&a.k_cache[k0..k1], &a.v_cache[k0..k1]);
                    if attn512q::worth(n_rows, group) {
                        // SAFETY: `rows_kernel` checked the level's features, the head size and group.
                        unsafe { attn512q::attend_lanes(&mut rows[..n_rows], keys, vals, seg * SEG, hd, scale) };
                    } else {
                        for chunk in rows[..n_rows].chunks_mut(attn512::max_rows(hd, group)) {
                            // SAFETY: as above.
                            unsafe { attn512::attend_rows(chunk, keys, vals, seg * SEG, hd, scale) };
                        }
                    }
                    continue;
                }
                for (row, &t) in rows[..n_rows].iter_mut().zip(&toks) {
                    let r = attention_keys(positions[t], window);
                    let (k0, k1) = ((kvh * cap + r.start) * hd, (kvh * cap + r.end) * hd);
                    let (keys, vals) = (&a.k_cache[k0..k1], &a.v_cache[k0..k1]);
                    // SAFETY: `range_kernel` returned a kernel only for a level whose features
                    // were detected, and for this head size and group.
                    unsafe { kernel(row.q, keys, vals, seg * SEG..row.end, hd, scale, row.out, row.ml.as_deref_mut()) }
                }
            }
        });
        self.team.for_chunks(positions.len() * n_kv, 1, &|range| {
            for tk in range {
                let ns = segs(tk / n_kv);
                if ns == 1 {
                    continue;
                }
                // SAFETY: item tk alone owns out[tk*gw..][..gw].
                let o = unsafe { out.slice(tk * gw, gw) };
                // SAFETY: the first region has ended; item tk alone reads its segments' partials.
                let p = unsafe { part.slice(tk * n_seg * gw, n_seg * gw) };
                // SAFETY: same, for their (max, sum) pairs.
                let m = unsafe { ml.slice(tk * n_seg * 2 * group, n_seg * 2 * group) };
                for h in 0..group {
                    let oh = &mut o[h * hd..(h + 1) * hd];
                    let mmax = (0..ns).map(|sg| m[sg * 2 * group + 2 * h]).fold(f32::NEG_INFINITY, f32::max);
                    let mut l = 0f32;
                    oh.fill(0.0);
                    for sg in 0..ns {
                        let w = (m[sg * 2 * group + 2 * h] - mmax).exp();
                        l += m[sg * 2 * group + 2 * h + 1] * w;
                        for (x, y) in oh.iter_mut().zip(&p[sg * gw + h * hd..sg * gw + (h + 1) * hd]) {
                            *x += y * w;
                        }
                    }
                    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
                    for x in oh.iter_mut() {
                        *x *= inv;
                    }
                }
            }
        });
    }
}

/// Attention of the query heads `q` ([g, hd]) sharing one KV head, at the chosen SIMD level.
/// Every level scans keys in position order with tiles at absolute positions.
#[allow(clippy::too_many_arguments)]
fn attend(simd: SimdLevel, q: &[f32], keys: &[f16], vals: &[f16], n_keys: usize, hd: usize, scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = range_kernel(simd, hd, q.len() / hd) {
        // SAFETY: `range_kernel` returns a kernel only for a detected level, head size and group.
        return unsafe { kernel(q, keys, vals, 0..n_keys, hd, scale, out, None) };
    }
    let _ = simd;
    for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
        ops::attend_head(qh, keys, vals, n_keys, scale, oh);
    }
}

/// Whether tokens go through `attn512q::attend_lanes` in blocks (the AVX-512 level, for the head
/// sizes and groups its kernel takes): a function of the level and the model's shape only.
#[cfg(target_arch = "x86_64")]
fn rows_kernel(simd: SimdLevel, hd: usize, group: usize) -> bool {
    simd == SimdLevel::Avx512Vnni && attn512::supports(hd, group)
}

/// A group of query heads against a range of keys (`avx2::attend_range`'s contract).
#[cfg(target_arch = "x86_64")]
type RangeKernel = unsafe fn(&[f32], &[f16], &[f16], std::ops::Range<usize>, usize, f32, &mut [f32], Option<&mut [f32]>);

/// The x86 attention kernel for `simd`, head size `hd` and `group` query heads per KV head:
/// AVX-512 (`attn512`) at the `Avx512Vnni` level, AVX2 at `Avx2` (and for the head sizes the
/// AVX-512 kernel does not take); `None` means the scalar reference. A function of the level and
/// the model's shape only, so every token of every batch takes the same one.
#[cfg(target_arch = "x86_64")]
fn range_kernel(simd: SimdLevel, hd: usize, group: usize) -> Option<RangeKernel> {
    let avx2_ok = hd % 8 == 0 && hd <= 256 && (1..=avx2::MAX_GROUP).contains(&group);
    match simd {
        SimdLevel::Avx512Vnni if attn512::supports(hd, group) => Some(attn512::attend_range),
        // SAFETY (of calling it): both levels are only set after detecting avx2, fma and f16c.
        SimdLevel::Avx2 | SimdLevel::Avx512Vnni if avx2_ok => Some(avx2::attend_range as RangeKernel),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod testutil;
