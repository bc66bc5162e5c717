//! Layers `[a, b)` of a Llama model resident on the GPU.
//!
//! * [`GpuLayers`] — the layers' weights (GGUF blocks, pack.rs) and the RoPE table, uploaded once and
//!   shared by every sequence and run state: the engine's offloaded segment (it implements
//!   `backend::offload::LayerOffload`, segment.rs).
//! * [`GpuActivations`] — the activation buffers of steps of up to `max_tokens` tokens, the
//!   parameter slots, and the bind group of every weight dispatch; one per run state (behind the
//!   engine's `OffloadActs` handle).
//! * `GpuKv` (kv.rs) — one sequence's keys and values for these layers (behind `OffloadKv`).
//! * `WgpuLayers` (segment.rs) — the three together for one sequence (tests, speed measurements).
//!
//! A step (layers/step.rs) writes the hidden state of every token of every
//! sequence, the positions and the parameters, submits the dispatches of all layers (recorded
//! ahead while the GPU ran the previous step of the same shape, or now), and reads back only the
//! final hidden state `[n_tok, n_embd]` (or the logits of chosen rows). Per layer:
//! RMSNorm, the fused q|k|v matmul over all tokens (and the q/k norms in place, where the model has
//! them), then per sequence RoPE + KV store
//! (rope_store.wgsl) and attention over that sequence's cache (kv.rs records these; with
//! `WgpuOptions::attention_one` a one-token sequence gets the two in one dispatch), then the output projection with
//! the residual add, RMSNorm, gate|up, SiLU·mul and the down projection with the residual add.
//! Embedding, the output norm, logits and sampling stay with the caller (the CPU).

use std::ops::Range;
use std::sync::Arc;

use super::context::{grid_1d, next_id, WgpuContext, MAX_HEAD_DIM, PARAM_WINDOW};
use super::kv::{attention_q8, gpu_kv, record_seqs, seq_dispatches, seq_params, split_chunks, window_param, GpuKv, KvPrecision, OMerge, QkvRope, SeqBuffers};
use super::plan::{batch_plan, one_token_plan, q8_bytes, takes_coop, Acts, PlanCtx, PlanItem, Step};
use super::DecodePlan;
use super::upload::{upload_rows, GpuLayer, GpuMatrix};
use super::WgpuError;
use crate::backend::cpu::ops::rope_table;
use crate::backend::offload::{missing_parts, FfnActivation, LayerPart, LayerShape, ModelTensors, RopeStyle, SeqSpan};

mod step;
pub(crate) use step::Ahead;
pub(super) use step::Prof;

/// One recorded token-wide dispatch: pipeline, bind group (with its parameter slot), what it computes.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    /// matmul_wide.wgsl's pipeline and bind group for the same step, taken by steps of
    /// `WgpuContext::tile_wide` tokens and more (see [`GpuLayers::wide`]; the same bits)
    wide: Option<(wgpu::ComputePipeline, wgpu::BindGroup)>,
    step: Step,
    /// For profiles: "matmul qkv", ...
    label: &'static str,
}

/// The token-wide dispatches of one layer: before the per-sequence attention and after it; for
/// steps of one token `pre1` / `post1` (plan.rs) when not empty.
struct LayerDispatches {
    pre: Vec<Dispatch>,
    post: Vec<Dispatch>,
    pre1: Vec<Dispatch>,
    post1: Vec<Dispatch>,
    /// whether `pre1` / `post1` exist (the one-token plan is not `Off`)
    one: bool,
    /// steps of one token: the q|k|v matmul with RoPE + KV store, recorded per sequence
    qkv_rope: Option<QkvRope>,
    /// steps of one token with split attention: the o projection folding the partials
    o_merge: Option<OMerge>,
}

impl LayerDispatches {
    /// The lists for a step of `n` tokens.
    fn lists(&self, n: usize) -> (&[Dispatch], &[Dispatch]) {
        if n == 1 && self.one {
            (&self.pre1, &self.post1)
        } else {
            (&self.pre, &self.post)
        }
    }
}

/// The output norm and projection on the GPU (when the stack ends with the model's last layer).
struct GpuHead {
    /// [n_embd] f32
    norm: wgpu::Buffer,
    out: GpuMatrix,
}

/// Logit rows per read-back of a step with the output head (more are done in several rounds).
pub const HEAD_ROWS: usize = 64;

/// Layers `[a, b)` of a model on the GPU: weights and RoPE table (see the module docs).
pub struct GpuLayers {
    id: u64,
    /// the device, queue and pipelines
    pub(crate) ctx: Arc<WgpuContext>,
    /// the model's hyper-parameters
    pub(crate) config: LayerShape,
    layers: Range<usize>,
    /// precision of the KV caches this stack makes
    pub(crate) kv: KvPrecision,
    gpu: Vec<GpuLayer>,
    /// [n_pos, head_dim / 2, 2] RoPE (cos, sin) table
    rope: wgpu::Buffer,
    /// the table of the sliding-window layers where their RoPE base differs (Gemma 3)
    rope_swa: Option<wgpu::Buffer>,
    /// per layer of the stack: whether it attends over the sliding window only
    windowed: Vec<bool>,
    n_pos: usize,
    head: Option<GpuHead>,
}

/// The head's buffers and bind groups in a [`GpuActivations`].
struct HeadActs {
    /// [HEAD_ROWS, n_embd] gathered rows, then normalized rows
    hx: wgpu::Buffer,
    _hn: wgpu::Buffer,
    /// [HEAD_ROWS, vocab]
    logits: wgpu::Buffer,
    staging: wgpu::Buffer,
    rows: usize,
    norm: Dispatch,
    out: Dispatch,
    /// parameter slots of the two dispatches
    slots: [usize; 2],
}

/// Activation buffers and bind groups for steps of up to `max_tokens` tokens (one per run state).
pub struct GpuActivations {
    /// unique among activation sets (see [`next_id`](super::context::next_id))
    pub(crate) id: u64,
    owner: u64,
    max_tokens: usize,
    /// [max_tokens, n_embd] residual stream (in and out)
    x: wgpu::Buffer,
    /// [max_tokens] u32 position of each token of the step
    pub(crate) pos: wgpu::Buffer,
    /// parameter slots, `slot_stride` bytes apart: the token-wide steps, then one per sequence
    pub(crate) params: wgpu::Buffer,
    slot_stride: u64,
    /// [max_tokens, n_embd] f32, MAP_READ
    staging: wgpu::Buffer,
    /// [max_tokens, n_head*hd + 2*kv_dim] fused q|k|v rows
    pub(crate) qkv: wgpu::Buffer,
    /// [max_tokens, n_head*hd] attention output
    pub(crate) att: wgpu::Buffer,
    /// [max_tokens] Q8 rows of the widest matmul input (q8_act.wgsl): the next Q8 matmul's input
    pub(crate) xq: wgpu::Buffer,
    /// kept alive for the bind groups: xn [max, n_embd], gu [max, 2*n_ff], act [max, n_ff], proj
    /// [max, n_embd] (where the model has post-norms)
    _other: Vec<wgpu::Buffer>,
    /// distinct token-wide steps; slot i of `params` holds the parameters of `slots[i]`
    slots: Vec<Step>,
    /// slots before the per-sequence ones: `slots`, then the head's two
    n_fixed: usize,
    layers: Vec<LayerDispatches>,
    /// parameter words of a step, reused (no allocation per step)
    words: Vec<u32>,
    head: Option<HeadActs>,
    /// the next step, recorded while the GPU ran this one (step.rs)
    ahead: Option<Ahead>,
}

impl GpuActivations {
    /// The most tokens a step may have.
    pub(super) fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Layer `li`'s one-token q|k|v matmul with RoPE + KV store, where the plan has one.
    pub(super) fn qkv_rope(&self, li: usize) -> Option<&QkvRope> {
        self.layers.get(li).and_then(|l| l.qkv_rope.as_ref())
    }

    /// Layer `li`'s one-token o projection folding a split attention's partials, where the plan has one.
    pub(super) fn o_merge(&self, li: usize) -> Option<&OMerge> {
        self.layers.get(li).and_then(|l| l.o_merge.as_ref())
    }
}

/// The parts of `model`'s layers this runner has no kernels for, if any (it runs the plain
/// Llama layer: RoPE without scaling on adjacent pairs or, rotating the whole head, NeoX's halves
/// (rope_store.wgsl; the one-token RoPE epilogues are adjacent-only and are not planned for NeoX),
/// SiLU or GeGLU gate (silu_mul.wgsl; a GeGLU model's one-token steps take the batch plan), no
/// biases (q/k norms: rmsnorm_heads.wgsl, in place after the q|k|v matmul; post-attention and
/// post-FFN norms: rmsnorm.wgsl's `add` after the projection writes `proj`); sliding-window
/// layers get their own parameter slot per sequence (attention.wgsl's `window`) and RoPE table;
/// queries may be wider than the residual stream (q|k|v, attention and o-projection widths are
/// n_head * head_dim throughout).
pub fn layers_unsupported(model: &dyn ModelTensors) -> Option<String> {
    use LayerPart::*;
    missing_parts(model, "wgpu", |p| matches!(p, NeoxRope | SlidingWindow | GeGlu | WideQueries | QkNorms | PostNorms))
}

impl GpuLayers {
    /// Uploads layers `layers` of `model` (weights as GGUF blocks, pack.rs) and a RoPE table for
    /// `n_pos` positions (clamped to the trained context).
    pub fn new(ctx: Arc<WgpuContext>, model: &dyn ModelTensors, layers: Range<usize>, n_pos: usize, kv: KvPrecision) -> Result<GpuLayers, WgpuError> {
        let c = model.shape();
        if let Some(why) = layers_unsupported(model) {
            return Err(WgpuError::Unsupported(why));
        }
        if layers.start > layers.end || layers.end > c.n_layer {
            return Err(WgpuError::Unsupported(format!("layers {layers:?} of a {}-layer model", c.n_layer)));
        }
        if !c.head_dim.is_multiple_of(8) || c.head_dim > MAX_HEAD_DIM || !c.n_embd.is_multiple_of(4) {
            return Err(WgpuError::Unsupported(format!("head_dim {} / n_embd {}", c.head_dim, c.n_embd)));
        }
        let n_pos = n_pos.clamp(1, c.n_ctx_train);
        let mut gpu = Vec::with_capacity(layers.len());
        for li in layers.clone() {
            gpu.push(GpuLayer::upload(&ctx, li, &model.layer(li))?);
        }
        let rope = ctx.storage_init("rope", bytemuck::cast_slice(&rope_table(n_pos, c.head_dim, c.rope_dims, c.rope_base)))?;
        let windowed: Vec<bool> = layers.clone().map(|li| c.window(li).is_some()).collect();
        // the CPU engine's `rope_swa`: the sliding layers' own base (RoPE scaling is refused above)
        let rope_swa = match windowed.contains(&true) && c.rope_base_swa != c.rope_base {
            true => Some(ctx.storage_init("rope swa", bytemuck::cast_slice(&rope_table(n_pos, c.head_dim, c.rope_dims, c.rope_base_swa)))?),
            false => None,
        };
        ctx.check()?;
        Ok(GpuLayers { id: next_id(), ctx, config: c, layers, kv, gpu, rope, rope_swa, windowed, n_pos, head: None })
    }

    /// Also uploads the output norm and projection, so that a step can return logits instead of
    /// the hidden state (`LayerOffload::forward` with logit rows). Only for a stack that ends with
    /// the last layer.
    pub fn with_head(mut self, model: &dyn ModelTensors) -> Result<GpuLayers, WgpuError> {
        if self.layers.end != self.config.n_layer {
            return Err(WgpuError::Unsupported(format!("an output head after layers {:?} of {}", self.layers, self.config.n_layer)));
        }
        let h = model.head();
        let norm = self.ctx.storage_init("output_norm", bytemuck::cast_slice(h.norm))?;
        let out = upload_rows(&self.ctx, &[h.output], "output", false)?.remove(0);
        self.head = Some(GpuHead { norm, out });
        self.ctx.check()?;
        Ok(self)
    }

    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.ctx
    }

    /// The model layers of this stack.
    pub(super) fn range(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Positions the RoPE table covers (a KV cache longer than this is refused).
    pub(super) fn n_pos(&self) -> usize {
        self.n_pos
    }

    /// Whether the output norm and projection are on the GPU ([`with_head`](Self::with_head)).
    pub(super) fn head_rows(&self) -> Option<usize> {
        self.head.as_ref().map(|h| h.out.rows)
    }

    /// Whether a sequence of one token gets attention_one.wgsl (`WgpuOptions::attention_one`;
    /// it ropes adjacent pairs only, so NeoX models take rope_store + attention).
    pub(super) fn attention_one(&self) -> bool {
        self.ctx.attention_one && self.config.rope_style == RopeStyle::Adjacent && !self.any_windowed()
    }

    /// Whether a layer of the stack attends over a sliding window (attention_one.wgsl and the
    /// one-token q|k|v + RoPE epilogue have no window or second RoPE table: not planned then).
    fn any_windowed(&self) -> bool {
        self.windowed.contains(&true)
    }

    /// Whether layer `li` of the stack (0 = its first) is a sliding-window layer.
    pub(super) fn windowed(&self, li: usize) -> bool {
        self.windowed.get(li).copied().unwrap_or(false)
    }

    /// Bytes of weights held on the GPU.
    pub(super) fn weights_on_gpu(&self) -> u64 {
        self.gpu.iter().map(GpuLayer::bytes).sum()
    }

    /// A KV cache of `capacity` positions for these layers.
    pub(super) fn new_gpu_kv(&self, capacity: usize) -> Result<GpuKv, WgpuError> {
        if capacity > self.n_pos {
            return Err(WgpuError::ContextFull { needed: capacity, capacity: self.n_pos });
        }
        GpuKv::new(self.ctx.clone(), self.id, &self.config, self.layers.len(), capacity.max(1), self.kv)
    }

    /// Activation buffers and bind groups for steps of up to `max_tokens` tokens.
    pub(super) fn activations(&self, max_tokens: usize) -> Result<GpuActivations, WgpuError> {
        let (ctx, c) = (&self.ctx, &self.config);
        let max_tokens = max_tokens.max(1);
        let (e, qd, kvd, ff) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim(), c.n_ff);
        let f32s = |n: usize| (n * 4) as u64;
        let qkvd = qd + 2 * kvd;
        // The tensor-core matmuls write whole tiles of tokens (matmul_coop.wgsl): the rows past
        // a step's tokens, up to the large tile's end, take values nobody reads.
        let coop = self.gpu.iter().any(|g| g.matrices().any(|w| takes_coop(&ctx.kernels, w)));
        let rows = if coop { max_tokens.next_multiple_of(super::coop::TOKENS) } else { max_tokens };
        let x = ctx.storage("x", f32s(rows * e))?;
        // `proj` only holds rows where the model has post-norms
        let post = self.gpu.iter().any(|g| g.post_attn_norm.is_some() || g.post_ffn_norm.is_some());
        let proj_w = if post { e } else { 1 };
        let [xn, qkv, att, gu, act, proj] = [e, qkvd, qd, 2 * ff, ff, proj_w].map(|w| ctx.storage("activation", f32s(rows * w)));
        let (xn, qkv, att, gu, act, proj) = (xn?, qkv?, att?, gu?, act?, proj?);
        // Q8 rows of the widest matmul input
        let xq = ctx.storage("q8 activations", q8_bytes(max_tokens, e.max(qd).max(ff)))?;
        let pos = ctx.storage("pos", (max_tokens * 4) as u64)?;
        let staging = ctx.staging("staging", f32s(max_tokens * e));

        let kern = &ctx.kernels;
        let mut plan: Vec<Vec<PlanItem<'_>>> = Vec::new();
        let mut plan1: Vec<Vec<PlanItem<'_>>> = Vec::new();
        // the one-token q|k|v matmul ropes in its epilogue: not where q/k norms come between
        let qk_norms = self.gpu.iter().any(|g| g.qk_norm.is_some());
        let pc = PlanCtx {
            kern,
            q8: ctx.q8,
            tile: ctx.tile,
            wide_cols: if ctx.tile_wide > 0 { ctx.options().tile_wide_cols } else { 0 },
            // (an o projection on the tensor cores reads attention's f32 rows)
            att_q8: attention_q8(ctx.q8, c) && !self.gpu.iter().all(|g| takes_coop(kern, &g.wo)),
            stage: ctx.stage,
            qkv_rope: ctx.qkv_rope && !ctx.attention_one && c.rope_style == RopeStyle::Adjacent && !qk_norms && !self.any_windowed(),
            o_merge: ctx.o_merge && ctx.attention_split,
            n_embd: e,
            norm: Step::RmsNorm { dim: e, eps: c.rms_eps },
            qkv_width: qkvd,
            gu_width: 2 * ff,
            post_norm: Step::PostNorm { dim: e, eps: c.rms_eps },
            head_norm: Step::HeadNorm { head_dim: c.head_dim, heads: c.n_head + c.n_head_kv, n_q: c.n_head, row: qkvd, eps: c.rms_eps },
        };
        let acts = Acts { x: &x, xn: &xn, xq: &xq, qkv: &qkv, att: &att, gu: &gu, act: &act, proj: &proj };
        let mut ropes: Vec<Option<PlanItem<'_>>> = Vec::new();
        let mut merges: Vec<Option<(usize, PlanItem<'_>)>> = Vec::new();
        for g in &self.gpu {
            // the one-token epilogues compute SiLU: a GeGLU model's steps of one token take the batch plan
            let decode = if c.ffn_activation == FfnActivation::Silu { ctx.decode } else { DecodePlan::Off };
            let one = one_token_plan(&pc, decode, g, &acts)?;
            plan1.push(one.list);
            ropes.push(one.rope);
            merges.push(one.o_merge);
            plan.push(batch_plan(&pc, g, &acts)?);
        }
        let mut slots: Vec<Step> = Vec::new();
        let merge_items = merges.iter().flatten().map(|(_, item)| item);
        for (_, _, s, _, _) in plan.iter().flatten().chain(plan1.iter().flatten()).chain(ropes.iter().flatten()).chain(merge_items) {
            if !slots.contains(s) {
                slots.push(*s);
            }
        }
        let slot_stride = ctx.uniform_align.max(PARAM_WINDOW);
        // token-wide steps, the head's two, then one per sequence (twice with sliding-window
        // layers: the second set with the window)
        let head_slots = [slots.len(), slots.len() + 1];
        let n_fixed = slots.len() + 2;
        let seq_sets = if self.any_windowed() { 2 } else { 1 };
        let params = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("layer params"),
            size: slot_stride * (n_fixed + seq_sets * max_tokens) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut layers: Vec<LayerDispatches> = Vec::with_capacity(self.gpu.len());
        let dispatch_of = |(pre, kernel, step, label, bufs): &PlanItem<'_>| {
            let slot = slots.iter().position(|s| s == step).unwrap_or(0) as u64;
            let mut binds = vec![(&params, slot * slot_stride, Some(PARAM_WINDOW))];
            binds.extend(bufs.iter().map(|b| (*b, 0, None)));
            let wide = match step {
                Step::MatMul { wide: Some(ty), coop: true, .. } => kern.matmul_coop.get(ty).map(|c| (c.tiles[1].pipeline.clone(), ctx.bind(&c.tiles[1], &binds))),
                Step::MatMul { wide: Some(ty), .. } => kern.matmul_wide.get(ty).map(|k| (k.pipeline.clone(), ctx.bind(k, &binds))),
                _ => None,
            };
            (*pre, Dispatch { pipeline: kernel.pipeline.clone(), bind: ctx.bind(kernel, &binds), wide, step: *step, label })
        };
        let slot_of = |step: &Step| slots.iter().position(|s| s == step).unwrap_or(0) as u64 * slot_stride;
        for (((chunk, one), rope), merge) in plan.iter().zip(&plan1).zip(&ropes).zip(&merges) {
            let o_merge = match merge {
                Some((at, (_, kernel, step, _, bufs))) => match bufs.as_slice() {
                    [w, y] => Some(OMerge { kernel: (*kernel).clone(), step: *step, param_offset: slot_of(step), bufs: [(*w).clone(), (*y).clone()], at: *at }),
                    _ => return Err(WgpuError::Unsupported("o + merge plan item".into())),
                },
                None => None,
            };
            let qkv_rope = match rope {
                Some((_, kernel, step, _, bufs)) => match bufs.as_slice() {
                    [w, x, y, g] => Some(QkvRope {
                        kernel: (*kernel).clone(),
                        step: *step,
                        param_offset: slot_of(step),
                        bufs: [(*w).clone(), (*x).clone(), (*y).clone(), (*g).clone()],
                    }),
                    _ => return Err(WgpuError::Unsupported("q|k|v + rope plan item".into())),
                },
                None => None,
            };
            let mut ld = LayerDispatches { pre: Vec::new(), post: Vec::new(), pre1: Vec::new(), post1: Vec::new(), one: !one.is_empty(), qkv_rope, o_merge };
            for (pre, d) in chunk.iter().map(dispatch_of) {
                if pre { ld.pre.push(d) } else { ld.post.push(d) }
            }
            for (pre, d) in one.iter().map(dispatch_of) {
                if pre { ld.pre1.push(d) } else { ld.post1.push(d) }
            }
            layers.push(ld);
        }
        let words = vec![0u32; (slot_stride / 4) as usize * (n_fixed + seq_sets * max_tokens)];
        let head = match &self.head {
            None => None,
            Some(h) => {
                let rows = max_tokens.min(HEAD_ROWS);
                let hx = ctx.storage("head x", f32s(rows * e))?;
                // normalized rows: f32, or Q8 rows when the projection reads them (plan.rs)
                let q8 = ctx.q8 && super::pack::packed(h.out.ty);
                let hn = if q8 { ctx.storage("head xq", q8_bytes(rows, e))? } else { ctx.storage("head xn", f32s(rows * e))? };
                let (norm_k, mm_map) = if q8 { (&kern.rmsnorm_q8, &kern.matmul_q8) } else { (&kern.rmsnorm, &kern.matmul) };
                let logits = ctx.storage("logits", f32s(rows * h.out.rows))?;
                let staging = ctx.staging("logits staging", f32s(rows * h.out.rows));
                let win = |slot: usize| (&params, slot as u64 * slot_stride, Some(PARAM_WINDOW));
                let norm_bind = ctx.bind(norm_k, &[win(head_slots[0]), (&hx, 0, None), (&h.norm, 0, None), (&hn, 0, None)]);
                let mmk = mm_map.get(&h.out.ty).ok_or_else(|| WgpuError::Unsupported(h.out.ty.name().into()))?;
                let out_bind = ctx.bind(mmk, &[win(head_slots[1]), (&h.out.buf, 0, None), (&hn, 0, None), (&logits, 0, None)]);
                let step = |rows: usize| Step::MatMul { rows, cols: h.out.cols, row_bytes: h.out.row_bytes, y_stride: h.out.rows, y_off: 0, accumulate: false, tile: false, wide: None, coop: false };
                Some(HeadActs {
                    norm: Dispatch { pipeline: norm_k.pipeline.clone(), bind: norm_bind, wide: None, step: Step::RmsNorm { dim: e, eps: c.rms_eps }, label: "output norm" },
                    out: Dispatch { pipeline: mmk.pipeline.clone(), bind: out_bind, wide: None, step: step(h.out.rows), label: "output" },
                    hx,
                    _hn: hn,
                    logits,
                    staging,
                    rows,
                    slots: head_slots,
                })
            }
        };
        ctx.check()?;
        Ok(GpuActivations {
            id: next_id(),
            owner: self.id,
            max_tokens,
            x,
            pos,
            params,
            slot_stride,
            staging,
            qkv,
            att,
            xq,
            _other: vec![xn, gu, act, proj],
            slots,
            n_fixed,
            layers,
            words,
            head,
            ahead: None,
        })
    }

    /// A step measured (`prof`): with `Prof::Dispatches` each dispatch runs in its own compute
    /// pass between GPU timestamps (milliseconds of GPU time per kind of dispatch, in order of
    /// first appearance); with `Prof::Span` the step is recorded and submitted as usual and timed
    /// as a whole (the GPU time from the start of its first pass to the end of its last, the
    /// CPU's set-up, recording and waiting, the wall time), in ms. `None` (after a plain step)
    /// when the adapter has no timestamp queries.
    pub(super) fn measured(
        &self,
        act: &mut GpuActivations,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        prof: Prof,
    ) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(act, hidden, positions, seqs, if self.ctx.timestamps { prof } else { Prof::Off }, None)
    }

    fn check_step(&self, act: &GpuActivations, hidden: &[f32], positions: &[u32], seqs: &mut [SeqSpan<'_>]) -> Result<(), WgpuError> {
        let n = positions.len();
        let e = self.config.n_embd;
        if act.owner != self.id {
            return Err(WgpuError::Unsupported("activations of another layer stack".into()));
        }
        if n > act.max_tokens {
            return Err(WgpuError::BatchTooLarge { got: n, max: act.max_tokens });
        }
        if hidden.len() != n * e || seqs.iter().map(|s| s.n_tok).sum::<usize>() != n {
            return Err(WgpuError::BadShape { got: hidden.len(), expected: n * e });
        }
        let mut t0 = 0;
        for s in seqs.iter_mut() {
            let Some(kv) = s.kv.get::<GpuKv>() else { return Err(WgpuError::Unsupported("a KV cache of another backend".into())) };
            if kv.owner != self.id {
                return Err(WgpuError::Unsupported("a KV cache of another layer stack".into()));
            }
            if s.start + s.n_tok > kv.capacity {
                return Err(WgpuError::ContextFull { needed: s.start + s.n_tok, capacity: kv.capacity });
            }
            for (i, &p) in positions[t0..t0 + s.n_tok].iter().enumerate() {
                if p as usize != s.start + i {
                    return Err(WgpuError::BadPositions { expected: s.start + i, got: p });
                }
            }
            t0 += s.n_tok;
        }
        Ok(())
    }

    /// The uniform parameters of `step` for a batch of `n` tokens (layouts in the .wgsl headers).
    fn params_of(&self, step: Step, n: usize) -> [u32; 8] {
        let n32 = n as u32;
        match step {
            Step::MatMul { rows, cols, row_bytes, y_stride, y_off, accumulate, .. } => {
                [rows as u32, cols as u32, n32, row_bytes as u32, y_stride as u32, y_off as u32, accumulate as u32, 0]
            }
            Step::CoopVec { rows, cols, row_bytes, y_off, accumulate } => [rows as u32, cols as u32, 1, row_bytes as u32, 0, y_off as u32, accumulate as u32, 0],
            Step::MatVec { rows, cols, row_bytes, y_off, accumulate, eps } => {
                [rows as u32, cols as u32, 1, row_bytes as u32, 0, y_off as u32, accumulate as u32, eps.to_bits()]
            }
            // Both write matmul inputs: swizzled rows (mm_x_f32.wgsl's X layout).
            Step::RmsNorm { dim, eps } => [dim as u32, n32, eps.to_bits(), 1, 0, 0, 0, 0],
            // plain rows added to the destination
            Step::PostNorm { dim, eps } => [dim as u32, n32, eps.to_bits(), 0, 1, 0, 0, 0],
            Step::Quantize { cols, swizzle } => [cols as u32, n32, swizzle as u32, 0, 0, 0, 0, 0],
            Step::HeadNorm { head_dim, n_q, row, eps, .. } => [head_dim as u32, n32, eps.to_bits(), (row / 4) as u32, n_q as u32, 0, 0, 0],
            Step::SiluMul { pairs, .. } => {
                let ff = self.config.n_ff as u32;
                let gelu = (self.config.ffn_activation == FfnActivation::GeluTanh) as u32;
                [n32, ff, 2 * ff, if pairs { 1 } else { ff }, 1, pairs as u32, gelu, 0]
            }
        }
    }

    /// Whether a step of `n` tokens runs `step` as matmul_wide.wgsl ([`Dispatch::wide`]): the
    /// one place the choice is made, for the pipeline and the grid alike. Either tile gives the
    /// decode kernels' bits, so the choice by batch size leaves a token's bits alone.
    fn wide(&self, step: Step, n: usize) -> bool {
        match step {
            Step::MatMul { wide: Some(_), coop: true, .. } => self.ctx.coop_wide > 0 && n >= self.ctx.coop_wide,
            Step::MatMul { wide: Some(_), .. } => self.ctx.tile_wide > 0 && n >= self.ctx.tile_wide,
            _ => false,
        }
    }

    /// The pipeline and bind group of `d` for a step of `n` tokens.
    fn pick<'a>(&self, d: &'a Dispatch, n: usize) -> (&'a wgpu::ComputePipeline, &'a wgpu::BindGroup) {
        match &d.wide {
            Some((p, b)) if self.wide(d.step, n) => (p, b),
            _ => (&d.pipeline, &d.bind),
        }
    }

    fn grid_of(&self, step: Step, n: usize) -> (u32, u32) {
        match step {
            Step::MatMul { rows, coop: true, .. } => super::coop::grid(rows, n, self.wide(step, n)),
            Step::MatMul { rows, tile: true, .. } => self.ctx.tile_grid(rows, n, self.wide(step, n)),
            Step::MatMul { rows, .. } => self.ctx.matmul_grid(rows, n),
            Step::MatVec { rows, .. } => self.ctx.matmul_grid(rows, 1),
            Step::CoopVec { rows, .. } => super::coop::one_token_grid(rows),
            // a workgroup per 256 vec4s of a token (rmsnorm.wgsl, rmsnorm_q8.wgsl)
            Step::RmsNorm { dim, .. } | Step::PostNorm { dim, .. } => (n as u32, dim.div_ceil(1024) as u32),
            Step::Quantize { cols, .. } => grid_1d(n * cols / 4),
            // a thread per vec4 (silu_mul_q8.wgsl) or per value (silu_mul.wgsl)
            Step::SiluMul { q8: true, .. } => grid_1d(n * self.config.n_ff / 4),
            Step::SiluMul { .. } => grid_1d(n * self.config.n_ff),
            // a workgroup per head of a token (rmsnorm_heads.wgsl)
            Step::HeadNorm { heads, .. } => (n as u32, heads as u32),
        }
    }

    /// The buffers a sequence's bind groups use besides its caches.
    pub(super) fn seq_buffers<'a>(&'a self, act: &'a GpuActivations) -> SeqBuffers<'a> {
        let rope_swa = self.rope_swa.as_ref().unwrap_or(&self.rope);
        SeqBuffers { id: act.id, qkv: &act.qkv, att: &act.att, pos: &act.pos, params: &act.params, rope: &self.rope, rope_swa, windowed: &self.windowed, xq: &act.xq }
    }
}

