//! [`GpuKv`]: one sequence's keys and values for the layers of a `GpuLayers` stack, in GPU
//! buffers `[n_kv_head, capacity, head_dim]` per layer (f16 pairs or f32), plus the bind groups
//! of its per-sequence dispatches (built on first use with a run state's activations, then
//! reused, so decode steps create nothing), and the recording of those dispatches
//! ([`record_seqs`]): a sequence of several tokens in a step gets rope_store.wgsl (RoPE of its
//! queries and keys, keys and values into the cache) then attention; with
//! `WgpuOptions::attention_one` (off by default: slower on the H100) a sequence of one token gets
//! one dispatch, attention_one, which does its RoPE and KV store itself (same bits,
//! attention.wgsl's header). A sequence of one token whose cache holds more than one chunk of 256
//! keys has its attention split over the chunks (one workgroup per query head and chunk, the
//! partials in the cache's `partials` buffer), then attention_merge.wgsl folds them
//! (`WgpuOptions::attention_split`, same bits), or, in a step of that one token where the plan
//! has it, the o projection folds them in its input stage and no merge runs ([`OMerge`],
//! `WgpuOptions::o_merge`, same bits).
//!
//! The cached length lives with the caller (the engine's `KvCache`): truncating is forgetting
//! positions, and [`GpuKv::copy_prefix_from`] copies positions between two caches on the GPU
//! (prefix reuse), ordered before any later step by the queue.

use std::sync::Arc;

use super::context::{grid_1d, next_id, WgpuContext, PARAM_WINDOW};
use super::pipeline::Kernel;
use super::plan::Step;
use super::WgpuError;
use crate::backend::offload::{DeviceKv, LayerShape, OffloadError, OffloadKv, RopeStyle, SeqSpan};

/// Element type of the GPU KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPrecision {
    /// f16, as the CPU engine's cache (half the memory).
    F16,
    F32,
}

/// The one-token q|k|v matmul with RoPE + KV store as its epilogue (mv_y_rope.wgsl; plan.rs): its
/// bind group also holds the sequence's caches, so this file builds it ([`GpuKv::bind_for`]).
pub(super) struct QkvRope {
    /// the mv_y_rope.wgsl pipeline of the layer's weight type
    pub kernel: Kernel,
    /// the dispatch's step (parameters and grid)
    pub step: Step,
    /// byte offset of `step`'s parameter slot
    pub param_offset: u64,
    /// bindings 1-4: weights, residual stream, q|k|v rows, norm weight
    pub bufs: [wgpu::Buffer; 4],
}

/// The one-token o projection that folds a split attention's partials in its input stage
/// (mvq_x_merge.wgsl; plan.rs): its bind group holds the sequence's partials and parameters, so
/// this file builds it ([`GpuKv::bind_for`]).
pub(super) struct OMerge {
    /// the mvq_x_merge.wgsl pipeline of the o projection's weight type
    pub kernel: Kernel,
    /// the dispatch's step (parameters and grid)
    pub step: Step,
    /// byte offset of `step`'s parameter slot
    pub param_offset: u64,
    /// bindings 1 and 3: weights, residual stream
    pub bufs: [wgpu::Buffer; 2],
    /// index of the plain o projection it replaces among the layer's one-token dispatches after attention
    pub at: usize,
}

/// What a sequence's bind groups use besides its caches: a run state's activations (`id`) and
/// the stack's RoPE table.
pub(super) struct SeqBuffers<'a> {
    /// the activations' id
    pub id: u64,
    /// [max_tokens, n_head*hd + 2*kv_dim] fused q|k|v rows
    pub qkv: &'a wgpu::Buffer,
    /// [max_tokens, n_head*hd] attention output
    pub att: &'a wgpu::Buffer,
    /// [max_tokens] u32 position of each token of the step
    pub pos: &'a wgpu::Buffer,
    /// parameter slots (the per-sequence ones at a dynamic offset)
    pub params: &'a wgpu::Buffer,
    /// [n_pos, head_dim / 2, 2] RoPE (cos, sin) table
    pub rope: &'a wgpu::Buffer,
    /// the sliding-window layers' RoPE table (`rope` where their base is the same)
    pub rope_swa: &'a wgpu::Buffer,
    /// per layer of the stack: a sliding-window layer (its bind groups take `rope_swa`)
    pub windowed: &'a [bool],
    /// [max_tokens] Q8 rows (q8_act.wgsl): attention's Q8 output
    pub xq: &'a wgpu::Buffer,
}

/// One layer's bind groups of a [`GpuKv`] (see its `binds`).
type LayerBinds = ([wgpu::BindGroup; 4], Option<wgpu::BindGroup>, Option<wgpu::BindGroup>);

pub struct GpuKv {
    /// unique among caches (a step recorded ahead is for these caches: layers/step.rs)
    pub(crate) id: u64,
    ctx: Arc<WgpuContext>,
    /// The `GpuLayers` this cache belongs to.
    pub(crate) owner: u64,
    /// positions each layer's cache holds per KV head
    pub(crate) capacity: usize,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    /// the chunk partials of a one-token attention split over chunks (attention_part.wgsl's S:
    /// [n_head, chunks(capacity), head_dim + 2] f32), shared by the layers (their dispatches run in order)
    partials: wgpu::Buffer,
    /// bytes per value: 2 (f16) or 4
    elem: usize,
    /// per layer of the stack: [n_kv_head, capacity, head_dim]
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    /// (activations id, per layer [rope_store, attention, attention_one, attention_merge] bind
    /// groups, the one-token q|k|v + RoPE matmul's and the o + merge matmul's, where the plan has them)
    binds: Option<(u64, Vec<LayerBinds>)>,
}

impl GpuKv {
    pub(crate) fn new(ctx: Arc<WgpuContext>, owner: u64, c: &LayerShape, n_layers: usize, capacity: usize, kv: KvPrecision) -> Result<GpuKv, WgpuError> {
        let elem = if kv == KvPrecision::F16 { 2 } else { 4 };
        let bytes = (c.n_head_kv * capacity * c.head_dim * elem) as u64;
        let mut k = Vec::with_capacity(n_layers);
        let mut v = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            k.push(ctx.storage("k_cache", bytes)?);
            v.push(ctx.storage("v_cache", bytes)?);
        }
        let partials = ctx.storage("attention_partials", partials_bytes(c.n_head, capacity, c.head_dim))?;
        Ok(GpuKv { id: next_id(), ctx, owner, capacity, n_head: c.n_head, n_kv_head: c.n_head_kv, head_dim: c.head_dim, partials, elem, k, v, binds: None })
    }

    /// A cache of `capacity` positions shaped like `other` (same stack, same precision).
    pub fn new_like(other: &GpuKv, capacity: usize) -> Result<GpuKv, WgpuError> {
        let bytes = (other.n_kv_head * capacity * other.head_dim * other.elem) as u64;
        let mut k = Vec::with_capacity(other.k.len());
        let mut v = Vec::with_capacity(other.k.len());
        for _ in 0..other.k.len() {
            k.push(other.ctx.storage("k_cache", bytes)?);
            v.push(other.ctx.storage("v_cache", bytes)?);
        }
        let partials = other.ctx.storage("attention_partials", partials_bytes(other.n_head, capacity, other.head_dim))?;
        Ok(GpuKv { id: next_id(), ctx: other.ctx.clone(), owner: other.owner, capacity, k, v, partials, binds: None, ..*other })
    }

    /// Bytes of GPU memory held.
    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size()).sum()
    }

    /// Makes positions 0..n of this cache equal to those of `src` (another sequence's cache of
    /// the same stack, any capacity), copying on the GPU.
    pub fn copy_prefix_from(&mut self, src: &GpuKv, n: usize) -> Result<(), WgpuError> {
        if src.owner != self.owner || src.elem != self.elem || src.k.len() != self.k.len() {
            return Err(WgpuError::Unsupported("copying KV between caches of different layer stacks".into()));
        }
        if n > src.capacity || n > self.capacity {
            return Err(WgpuError::ContextFull { needed: n, capacity: src.capacity.min(self.capacity) });
        }
        if n == 0 {
            return Ok(());
        }
        let row = (self.head_dim * self.elem) as u64;
        let mut enc = self.ctx.encoder();
        for (s, d) in src.k.iter().zip(&self.k).chain(src.v.iter().zip(&self.v)) {
            for h in 0..self.n_kv_head as u64 {
                enc.copy_buffer_to_buffer(s, h * src.capacity as u64 * row, d, h * self.capacity as u64 * row, n as u64 * row);
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.check()
    }

    /// Builds the bind groups of this cache's dispatches for the activations of `b` unless they
    /// exist already; `plan(li)`: layer `li`'s one-token q|k|v + RoPE matmul and o + merge
    /// matmul, where the plan has them.
    pub(crate) fn bind_for<'a>(&mut self, b: &SeqBuffers<'a>, plan: impl Fn(usize) -> (Option<&'a QkvRope>, Option<&'a OMerge>)) -> Result<(), WgpuError> {
        if self.binds.as_ref().is_some_and(|(id, _)| *id == b.id) {
            return Ok(());
        }
        let (qkv, att, pos, params, xq, s) = (b.qkv, b.att, b.pos, b.params, b.xq, &self.partials);
        let k = &self.ctx.kernels;
        let p = (params, 0, Some(PARAM_WINDOW));
        let binds = self
            .k
            .iter()
            .zip(&self.v)
            .enumerate()
            .map(|(li, (kc, vc))| {
                let rope = if b.windowed.get(li).copied().unwrap_or(false) { b.rope_swa } else { b.rope };
                let (qkv_rope, o_merge) = plan(li);
                let o_merge = o_merge.map(|m| {
                    let w = (params, m.param_offset, Some(PARAM_WINDOW));
                    let [w1, y] = &m.bufs;
                    self.ctx.bind(&m.kernel, &[w, (w1, 0, None), (s, 0, None), (y, 0, None), (pos, 0, None), p])
                });
                let qkv_rope = qkv_rope.map(|q| {
                    let w = (params, q.param_offset, Some(PARAM_WINDOW));
                    let [b1, b2, b3, b4] = &q.bufs;
                    let bufs = [w, (b1, 0, None), (b2, 0, None), (b3, 0, None), (b4, 0, None), (kc, 0, None), (vc, 0, None), (rope, 0, None), (pos, 0, None), p];
                    self.ctx.bind(&q.kernel, &bufs)
                });
                let groups = [
                    self.ctx.bind(&k.rope_store, &[p, (qkv, 0, None), (rope, 0, None), (pos, 0, None), (kc, 0, None), (vc, 0, None)]),
                    self.ctx.bind(&k.attention, &[p, (qkv, 0, None), (kc, 0, None), (vc, 0, None), (pos, 0, None), (att, 0, None), (xq, 0, None), (s, 0, None)]),
                    self.ctx.bind(
                        &k.attention_one,
                        &[p, (qkv, 0, None), (kc, 0, None), (vc, 0, None), (pos, 0, None), (att, 0, None), (rope, 0, None), (xq, 0, None), (s, 0, None)],
                    ),
                    self.ctx.bind(&k.attention_merge, &[p, (s, 0, None), (kc, 0, None), (vc, 0, None), (pos, 0, None), (att, 0, None), (xq, 0, None)]),
                ];
                (groups, qkv_rope, o_merge)
            })
            .collect();
        self.binds = Some((b.id, binds));
        self.ctx.check()
    }

    /// Bind group `which` (0: rope_store, 1: attention, 2: attention_one, 3: attention_merge) of layer `li` of the
    /// stack; only after [`bind_for`](Self::bind_for).
    fn bind(&self, li: usize, which: usize) -> &wgpu::BindGroup {
        match &self.binds {
            Some((_, b)) => &b[li].0[which],
            None => unreachable!("GpuKv::bind before bind_for"),
        }
    }

    /// The bind group of layer `li`'s one-token q|k|v + RoPE matmul (see [`bind_for`](Self::bind_for)).
    pub(crate) fn qkv_rope_bind(&self, li: usize) -> Option<&wgpu::BindGroup> {
        self.binds.as_ref().and_then(|(_, b)| b.get(li)).and_then(|l| l.1.as_ref())
    }

    /// The bind group of layer `li`'s one-token o + merge matmul (see [`bind_for`](Self::bind_for)).
    pub(crate) fn o_merge_bind(&self, li: usize) -> Option<&wgpu::BindGroup> {
        self.binds.as_ref().and_then(|(_, b)| b.get(li)).and_then(|l| l.2.as_ref())
    }
}

impl DeviceKv for GpuKv {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn bytes(&self) -> u64 {
        GpuKv::bytes(self)
    }

    fn empty_like(&self, capacity: usize) -> Result<OffloadKv, OffloadError> {
        Ok(OffloadKv::new(GpuKv::new_like(self, capacity)?))
    }

    fn copy_prefix_from(&mut self, src: &OffloadKv, n: usize) -> Result<(), OffloadError> {
        let src = src.get::<GpuKv>().ok_or_else(|| WgpuError::Unsupported("copying KV from another backend's cache".into()))?;
        Ok(GpuKv::copy_prefix_from(self, src, n)?)
    }
}

/// The wgpu cache of a step's sequence. A step checks every cache first
/// (`GpuLayers::check_step`: a [`GpuKv`] of this stack), so there is no other.
pub(super) fn gpu_kv<'s>(s: &'s SeqSpan<'_>) -> &'s GpuKv {
    match s.kv.get::<GpuKv>() {
        Some(kv) => kv,
        None => unreachable!("a step's caches are checked before it records"),
    }
}

/// Keys per chunk of attention.wgsl (attention_part.wgsl's C).
const ATTENTION_CHUNK: usize = 256;

/// Bytes of a cache's attention partials buffer (attention_part.wgsl's S).
fn partials_bytes(n_head: usize, capacity: usize, head_dim: usize) -> u64 {
    (n_head * capacity.div_ceil(ATTENTION_CHUNK) * (head_dim + 2) * 4) as u64
}

/// Chunks a sequence's attention is split over (one workgroup per query head and chunk, then
/// attention_merge.wgsl): a sequence of one token when `split` (`WgpuContext::attention_split`)
/// whose cache holds more than one chunk; else 1 (one workgroup per query head and token walks
/// every chunk). The grid covers the cache's capacity, so that a step recorded ahead stays valid
/// as the sequence grows: workgroups past the token's keys return at once.
pub(crate) fn split_chunks(split: bool, s: &SeqSpan<'_>) -> usize {
    let chunks = gpu_kv(s).capacity.div_ceil(ATTENTION_CHUNK);
    if split && s.n_tok == 1 && chunks > 1 {
        chunks
    } else {
        1
    }
}

/// Dispatches per layer of the sequences of a step (see [`record_seqs`]).
pub(crate) fn seq_dispatches(seqs: &[SeqSpan<'_>], one: bool, split: bool) -> usize {
    seqs.iter().map(|s| usize::from(!(one && s.n_tok == 1)) + 1 + usize::from(split_chunks(split, s) > 1)).sum()
}

/// Hands the per-sequence dispatches of layer `li` of a step to `emit` in order: (label, pipeline,
/// bind group, the sequence's index = its parameter slot, grid). First rope_store for each
/// sequence of several tokens (none when `roped`: the q|k|v matmul did it), then each sequence's
/// attention: attention_one for a sequence of one token when `one` (`WgpuContext::attention_one`),
/// which does what rope_store would; split over chunks of keys when `split` allows
/// ([`split_chunks`]), followed by attention_merge unless `merged` (the o projection folds the
/// partials: the step's one sequence of one token).
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_seqs<'a>(
    one: bool,
    split: bool,
    roped: bool,
    merged: bool,
    ctx: &'a WgpuContext,
    c: &LayerShape,
    seqs: &'a [SeqSpan<'_>],
    li: usize,
    mut emit: impl FnMut(&'static str, &'a wgpu::ComputePipeline, &'a wgpu::BindGroup, usize, (u32, u32)),
) {
    let k = &ctx.kernels;
    let single = |s: &SeqSpan<'_>| one && s.n_tok == 1;
    for (i, s) in seqs.iter().enumerate().filter(|(_, s)| !roped && !single(s)) {
        let grid = grid_1d(s.n_tok * (c.n_head + 2 * c.n_head_kv) * c.head_dim / 2);
        emit("rope + kv store", &k.rope_store.pipeline, gpu_kv(s).bind(li, 0), i, grid);
    }
    for (i, s) in seqs.iter().enumerate() {
        // attention.wgsl: a grid taller than the sequence's tokens is the split (one token)
        let chunks = split_chunks(split, s);
        let grid = (c.n_head as u32, (s.n_tok * chunks) as u32);
        let grouped = ctx.attention_kv(c.n_head, c.n_head_kv, c.head_dim, s.n_tok);
        match (single(s), grouped) {
            (true, _) => emit("attention + rope + kv store", &k.attention_one.pipeline, gpu_kv(s).bind(li, 2), i, grid),
            (false, Some((kv, g))) if chunks == 1 => emit("attention by kv head", &kv.pipeline, gpu_kv(s).bind(li, 1), i, g),
            (false, _) => emit("attention", &k.attention.pipeline, gpu_kv(s).bind(li, 1), i, grid),
        }
        if chunks > 1 && !merged {
            emit("attention merge", &k.attention_merge.pipeline, gpu_kv(s).bind(li, 3), i, (c.n_head as u32, 1));
        }
    }
}

/// Parameters of rope_store.wgsl and attention.wgsl for one sequence (rows t0..t0+n_tok).
/// `q8_out`: attention also writes its output as Q8 rows (see [`attention_q8`]).
pub(crate) fn seq_params(c: &LayerShape, kv: KvPrecision, capacity: usize, t0: usize, n_tok: usize, q8_out: bool) -> [u32; 14] {
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    let qkvd = c.n_head * c.head_dim + 2 * c.kv_dim();
    let f16 = (kv == KvPrecision::F16) as u32;
    // attention's output feeds the o projection: swizzled rows (word 9); word 11 must stay 0
    // (attention_one.wgsl ORs it into its f16 round trip so that no compiler folds it away)
    // word 12: no sliding window (the layer runner sets it in the windowed layers' slots, step.rs);
    // word 13: RoPE pairing of rope_store.wgsl
    let neox = (c.rope_style == RopeStyle::Neox) as u32;
    [n_tok as u32, t0 as u32, c.n_head as u32, c.n_head_kv as u32, c.head_dim as u32, capacity as u32, f16, qkvd as u32, scale.to_bits(), 1, q8_out as u32, 0, 0, neox]
}

/// attention.wgsl's `window` word: 0 without a sliding window.
pub(crate) fn window_param(window: Option<usize>) -> u32 {
    window.map_or(0, |w| u32::try_from(w.max(1)).unwrap_or(u32::MAX))
}

/// Whether the layer runner's attention writes its output as Q8 rows too (attention.wgsl,
/// `q8_out`), so that no quantize_q8 dispatch runs before a Q8 o projection (plan.rs): with the
/// integer-dot matmuls on and heads of whole blocks of 32.
pub(crate) fn attention_q8(q8: bool, c: &LayerShape) -> bool {
    q8 && c.head_dim.is_multiple_of(32)
}
