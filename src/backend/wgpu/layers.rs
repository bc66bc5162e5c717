//! Layers `[a, b)` of a Llama model resident on the GPU.
//!
//! * [`GpuLayers`] — the layers' weights (GGUF blocks, pack.rs) and the RoPE table, uploaded once and
//!   shared by every sequence and run state (the engine's `Model` owns one).
//! * [`GpuActivations`] — the activation buffers of steps of up to `max_tokens` tokens, the
//!   parameter slots, and the bind group of every weight dispatch; one per run state.
//! * [`GpuKv`](super::kv::GpuKv) — one sequence's keys and values for these layers.
//! * [`WgpuLayers`] — the three together for one sequence (tests, speed measurements).
//!
//! A step ([`GpuLayers::forward`], layers/step.rs) writes the hidden state of every token of every
//! sequence, the positions and the parameters, submits the dispatches of all layers (recorded
//! ahead while the GPU ran the previous step of the same shape, or now), and reads back only the
//! final hidden state `[n_tok, n_embd]` (or the logits of chosen rows). Per layer:
//! RMSNorm, the fused q|k|v matmul over all tokens, then per sequence RoPE + KV store
//! (rope_store.wgsl) and attention over that sequence's cache (kv.rs records these; with
//! `WgpuOptions::attention_one` a one-token sequence gets the two in one dispatch), then the output projection with
//! the residual add, RMSNorm, gate|up, SiLU·mul and the down projection with the residual add.
//! Embedding, the output norm, logits and sampling stay with the caller (the CPU).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::context::{grid_1d, Kernel, WgpuContext, MAX_HEAD_DIM};
use super::kv::{attention_q8, record_seqs, seq_dispatches, seq_params, GpuKv};
use super::plan::{batch_plan, one_token_plan, q8_bytes, Acts, PlanCtx, PlanItem};
pub(super) use super::upload::GpuMatrix;
use super::upload::upload_rows;
use super::WgpuError;
use crate::backend::cpu::ops::rope_table;
use crate::engine::{LlamaConfig, Model};

mod step;
pub(crate) use step::Ahead;
use step::Prof;

/// Element type of the GPU KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPrecision {
    /// f16, as the CPU engine's cache (half the memory).
    F16,
    F32,
}

/// Bytes of one parameter window (16 words); slots are `slot_stride` bytes apart.
pub(crate) const PARAM_WINDOW: u64 = 64;

pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(super) struct GpuLayer {
    /// [n_embd] f32
    pub attn_norm: wgpu::Buffer,
    /// wq|wk|wv stacked when they share a type, else the three
    pub qkv: Vec<GpuMatrix>,
    pub wo: GpuMatrix,
    /// [n_embd] f32
    pub ffn_norm: wgpu::Buffer,
    /// w_gate|w_up stacked when they share a type, else the two
    pub gate_up: Vec<GpuMatrix>,
    pub w_down: GpuMatrix,
}

/// What one token-wide dispatch computes; with the batch size it gives the parameters and grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Step {
    /// `accumulate`: add into the destination (the residual stream) instead of writing.
    MatMul { rows: usize, cols: usize, row_bytes: usize, y_stride: usize, y_off: usize, accumulate: bool },
    /// One token's matmul (matmul_vec.wgsl); `eps` for a folded RMSNorm (mv_x_norm.wgsl,
    /// mvq_x_stage.wgsl).
    MatVec { rows: usize, cols: usize, row_bytes: usize, y_off: usize, accumulate: bool, eps: f32 },
    /// rmsnorm.wgsl or rmsnorm_q8.wgsl (same parameters)
    RmsNorm { dim: usize, eps: f32 },
    /// quantize_q8.wgsl: rows of `cols` (swizzled or plain) to Q8 rows
    Quantize { cols: usize, swizzle: bool },
    /// `pairs`: gate and up interleaved (upload.rs)
    SiluMul { pairs: bool },
}

/// One recorded token-wide dispatch: pipeline, bind group (with its parameter slot), what it computes.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
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
}

/// The one-token q|k|v matmul with RoPE + KV store as its epilogue (mv_y_rope.wgsl; plan.rs): its
/// bind group also holds the sequence's caches, so kv.rs builds it (`GpuKv::bind_for`).
pub(super) struct QkvRope {
    pub kernel: Kernel,
    pub step: Step,
    /// byte offset of `step`'s parameter slot
    pub param_offset: u64,
    /// bindings 1-4: weights, residual stream, q|k|v rows, norm weight
    pub bufs: [wgpu::Buffer; 4],
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

/// Logit rows per read-back of [`GpuLayers::forward_logits`] (more are done in several rounds).
pub const HEAD_ROWS: usize = 64;


pub struct GpuLayers {
    id: u64,
    pub(crate) ctx: Arc<WgpuContext>,
    pub(crate) config: LlamaConfig,
    layers: Range<usize>,
    pub(crate) kv: KvPrecision,
    gpu: Vec<GpuLayer>,
    /// [n_pos, head_dim / 2, 2] RoPE (cos, sin) table
    rope: wgpu::Buffer,
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
    /// kept alive for the bind groups: xn [max, n_embd], gu [max, 2*n_ff], act [max, n_ff]
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
    /// Layer `li`'s one-token q|k|v matmul with RoPE + KV store, where the plan has one.
    pub(super) fn qkv_rope(&self, li: usize) -> Option<&QkvRope> {
        self.layers.get(li).and_then(|l| l.qkv_rope.as_ref())
    }
}

/// One sequence's part of a step: its KV cache and its tokens, which are `n_tok` consecutive rows
/// of the step at positions `start, start + 1, ...` (`start` = the sequence's cached length).
pub struct SeqSpan<'a> {
    pub kv: &'a mut GpuKv,
    pub start: usize,
    pub n_tok: usize,
}

impl GpuLayers {
    /// Uploads layers `layers` of `model` (weights as GGUF blocks, pack.rs) and a RoPE table for
    /// `n_pos` positions (clamped to the trained context).
    pub fn new(ctx: Arc<WgpuContext>, model: &Model, layers: Range<usize>, n_pos: usize, kv: KvPrecision) -> Result<GpuLayers, WgpuError> {
        let c = model.config.clone();
        if layers.start > layers.end || layers.end > c.n_layer {
            return Err(WgpuError::Unsupported(format!("layers {layers:?} of a {}-layer model", c.n_layer)));
        }
        if !c.head_dim.is_multiple_of(8) || c.head_dim > MAX_HEAD_DIM || !c.n_embd.is_multiple_of(4) {
            return Err(WgpuError::Unsupported(format!("head_dim {} / n_embd {}", c.head_dim, c.n_embd)));
        }
        let n_pos = n_pos.clamp(1, c.n_ctx_train);
        let mut gpu = Vec::with_capacity(layers.len());
        for li in layers.clone() {
            let lw = &model.weights.layers[li];
            let norm = |v: &[f32], name: &str| ctx.storage_init(&format!("blk.{li}.{name}"), bytemuck::cast_slice(v));
            gpu.push(GpuLayer {
                attn_norm: norm(&lw.attn_norm, "attn_norm")?,
                qkv: upload_rows(&ctx, model, &[&lw.wq, &lw.wk, &lw.wv], &format!("blk.{li}.attn_qkv"), false)?,
                wo: upload_rows(&ctx, model, &[&lw.wo], &format!("blk.{li}.attn_output"), false)?.remove(0),
                ffn_norm: norm(&lw.ffn_norm, "ffn_norm")?,
                gate_up: upload_rows(&ctx, model, &[&lw.w_gate, &lw.w_up], &format!("blk.{li}.ffn_gate_up"), true)?,
                w_down: upload_rows(&ctx, model, &[&lw.w_down], &format!("blk.{li}.ffn_down"), false)?.remove(0),
            });
        }
        let rope = ctx.storage_init("rope", bytemuck::cast_slice(&rope_table(n_pos, c.head_dim, c.rope_dims, c.rope_base)))?;
        ctx.check()?;
        Ok(GpuLayers { id: next_id(), ctx, config: c, layers, kv, gpu, rope, n_pos, head: None })
    }

    /// Also uploads the output norm and projection, so that [`forward_logits`](Self::forward_logits)
    /// can return logits instead of the hidden state. Only for a stack that ends with the last layer.
    pub fn with_head(mut self, model: &Model) -> Result<GpuLayers, WgpuError> {
        if self.layers.end != self.config.n_layer {
            return Err(WgpuError::Unsupported(format!("an output head after layers {:?} of {}", self.layers, self.config.n_layer)));
        }
        let norm = self.ctx.storage_init("output_norm", bytemuck::cast_slice(&model.weights.output_norm))?;
        let out = upload_rows(&self.ctx, model, &[&model.weights.output], "output", false)?.remove(0);
        self.head = Some(GpuHead { norm, out });
        self.ctx.check()?;
        Ok(self)
    }

    /// Whether logits come from the GPU ([`with_head`](Self::with_head)).
    pub fn has_head(&self) -> bool {
        self.head.is_some()
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.ctx
    }

    /// Positions the RoPE table covers (a KV cache longer than this is refused).
    pub fn max_positions(&self) -> usize {
        self.n_pos
    }

    /// Bytes of weights held on the GPU.
    pub fn weight_bytes(&self) -> u64 {
        self.gpu.iter().map(|g| g.qkv.iter().chain(&g.gate_up).chain([&g.wo, &g.w_down]).map(|m| m.buf.size()).sum::<u64>()).sum()
    }

    /// A KV cache of `capacity` positions for these layers.
    pub fn new_kv(&self, capacity: usize) -> Result<GpuKv, WgpuError> {
        if capacity > self.n_pos {
            return Err(WgpuError::ContextFull { needed: capacity, capacity: self.n_pos });
        }
        GpuKv::new(self.ctx.clone(), self.id, &self.config, self.layers.len(), capacity.max(1), self.kv)
    }

    /// Activation buffers and bind groups for steps of up to `max_tokens` tokens.
    pub fn activations(&self, max_tokens: usize) -> Result<GpuActivations, WgpuError> {
        let (ctx, c) = (&self.ctx, &self.config);
        let max_tokens = max_tokens.max(1);
        let (e, qd, kvd, ff) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim(), c.n_ff);
        let f32s = |n: usize| (n * 4) as u64;
        let qkvd = qd + 2 * kvd;
        let x = ctx.storage("x", f32s(max_tokens * e))?;
        let [xn, qkv, att, gu, act] = [e, qkvd, qd, 2 * ff, ff].map(|w| ctx.storage("activation", f32s(max_tokens * w)));
        let (xn, qkv, att, gu, act) = (xn?, qkv?, att?, gu?, act?);
        // Q8 rows of the widest matmul input
        let xq = ctx.storage("q8 activations", q8_bytes(max_tokens, e.max(qd).max(ff)))?;
        let pos = ctx.storage("pos", (max_tokens * 4) as u64)?;
        let staging = ctx.staging("staging", f32s(max_tokens * e));

        let kern = &ctx.kernels;
        let mut plan: Vec<Vec<PlanItem<'_>>> = Vec::new();
        let mut plan1: Vec<Vec<PlanItem<'_>>> = Vec::new();
        let pc = PlanCtx { kern, q8: ctx.q8, att_q8: attention_q8(ctx.q8, c), stage: ctx.stage, qkv_rope: ctx.qkv_rope && !ctx.attention_one, n_embd: e, norm: Step::RmsNorm { dim: e, eps: c.rms_eps }, qkv_width: qkvd, gu_width: 2 * ff };
        let acts = Acts { x: &x, xn: &xn, xq: &xq, qkv: &qkv, att: &att, gu: &gu, act: &act };
        let mut ropes: Vec<Option<PlanItem<'_>>> = Vec::new();
        for g in &self.gpu {
            let (one, rope) = one_token_plan(&pc, ctx.decode, g, &acts)?;
            plan1.push(one);
            ropes.push(rope);
            plan.push(batch_plan(&pc, g, &acts)?);
        }
        let mut slots: Vec<Step> = Vec::new();
        for (_, _, s, _, _) in plan.iter().flatten().chain(plan1.iter().flatten()).chain(ropes.iter().flatten()) {
            if !slots.contains(s) {
                slots.push(*s);
            }
        }
        let slot_stride = ctx.uniform_align.max(PARAM_WINDOW);
        // token-wide steps, the head's two, then one per sequence
        let head_slots = [slots.len(), slots.len() + 1];
        let n_fixed = slots.len() + 2;
        let params = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("layer params"),
            size: slot_stride * (n_fixed + max_tokens) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut layers: Vec<LayerDispatches> = Vec::with_capacity(self.gpu.len());
        let dispatch_of = |(pre, kernel, step, label, bufs): &PlanItem<'_>| {
            let slot = slots.iter().position(|s| s == step).unwrap_or(0) as u64;
            let mut binds = vec![(&params, slot * slot_stride, Some(PARAM_WINDOW))];
            binds.extend(bufs.iter().map(|b| (*b, 0, None)));
            (*pre, Dispatch { pipeline: kernel.pipeline.clone(), bind: ctx.bind(kernel, &binds), step: *step, label })
        };
        for ((chunk, one), rope) in plan.iter().zip(&plan1).zip(&ropes) {
            let qkv_rope = match rope {
                Some((_, kernel, step, _, bufs)) => match bufs.as_slice() {
                    [w, x, y, g] => Some(QkvRope {
                        kernel: (*kernel).clone(),
                        step: *step,
                        param_offset: slots.iter().position(|s| s == step).unwrap_or(0) as u64 * slot_stride,
                        bufs: [(*w).clone(), (*x).clone(), (*y).clone(), (*g).clone()],
                    }),
                    _ => return Err(WgpuError::Unsupported("q|k|v + rope plan item".into())),
                },
                None => None,
            };
            let mut ld = LayerDispatches { pre: Vec::new(), post: Vec::new(), pre1: Vec::new(), post1: Vec::new(), one: !one.is_empty(), qkv_rope };
            for (pre, d) in chunk.iter().map(dispatch_of) {
                if pre { ld.pre.push(d) } else { ld.post.push(d) }
            }
            for (pre, d) in one.iter().map(dispatch_of) {
                if pre { ld.pre1.push(d) } else { ld.post1.push(d) }
            }
            layers.push(ld);
        }
        let words = vec![0u32; (slot_stride / 4) as usize * (n_fixed + max_tokens)];
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
                let step = |rows: usize| Step::MatMul { rows, cols: h.out.cols, row_bytes: h.out.row_bytes, y_stride: h.out.rows, y_off: 0, accumulate: false };
                Some(HeadActs {
                    norm: Dispatch { pipeline: norm_k.pipeline.clone(), bind: norm_bind, step: Step::RmsNorm { dim: e, eps: c.rms_eps }, label: "output norm" },
                    out: Dispatch { pipeline: mmk.pipeline.clone(), bind: out_bind, step: step(h.out.rows), label: "output" },
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
            _other: vec![xn, gu, act],
            slots,
            n_fixed,
            layers,
            words,
            head,
            ahead: None,
        })
    }

    /// Runs these layers over `hidden` ([n_tok, n_embd], replaced by the layers' output). The
    /// step's tokens are the sequences' tokens in order; `positions` holds each token's position
    /// (for sequence s: `s.start, s.start + 1, ...`). Keys and values go into each sequence's cache.
    pub fn forward(&self, act: &mut GpuActivations, hidden: &mut [f32], positions: &[u32], seqs: &mut [SeqSpan<'_>]) -> Result<(), WgpuError> {
        self.step(act, hidden, positions, seqs, Prof::Off, None).map(|_| ())
    }

    /// [`forward`](Self::forward), then the output norm and projection on the GPU for the step
    /// rows `rows` (indices into the step's tokens): `logits` [rows.len(), vocab] in that order.
    /// `hidden` is not read back. Needs [`with_head`](Self::with_head).
    pub fn forward_logits(
        &self,
        act: &mut GpuActivations,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        rows: &[u32],
        logits: &mut [f32],
    ) -> Result<(), WgpuError> {
        let Some(h) = &self.head else { return Err(WgpuError::Unsupported("logits without an output head".into())) };
        if logits.len() != rows.len() * h.out.rows || rows.iter().any(|&r| r as usize >= positions.len()) {
            return Err(WgpuError::BadShape { got: logits.len(), expected: rows.len() * h.out.rows });
        }
        self.step(act, hidden, positions, seqs, Prof::Off, Some((rows, logits))).map(|_| ())
    }

    /// [`forward`](Self::forward) measured (`prof`): with `Prof::Dispatches` each dispatch runs in
    /// its own compute pass between GPU timestamps (milliseconds of GPU time per kind of dispatch,
    /// in order of first appearance); with `Prof::Span` the step is recorded and submitted as
    /// usual and timed as a whole (the GPU time from the start of its first pass to the end of
    /// its last, the CPU's set-up, recording and waiting, the wall time), in ms. `None` (after a
    /// plain forward) when the adapter has no timestamp queries.
    fn forward_measured(
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
            if s.kv.owner != self.id {
                return Err(WgpuError::Unsupported("a KV cache of another layer stack".into()));
            }
            if s.start + s.n_tok > s.kv.capacity {
                return Err(WgpuError::ContextFull { needed: s.start + s.n_tok, capacity: s.kv.capacity });
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
            Step::MatMul { rows, cols, row_bytes, y_stride, y_off, accumulate } => {
                [rows as u32, cols as u32, n32, row_bytes as u32, y_stride as u32, y_off as u32, accumulate as u32, 0]
            }
            Step::MatVec { rows, cols, row_bytes, y_off, accumulate, eps } => {
                [rows as u32, cols as u32, 1, row_bytes as u32, 0, y_off as u32, accumulate as u32, eps.to_bits()]
            }
            // Both write matmul inputs: swizzled rows (mm_x_f32.wgsl's X layout).
            Step::RmsNorm { dim, eps } => [dim as u32, n32, eps.to_bits(), 1, 0, 0, 0, 0],
            Step::Quantize { cols, swizzle } => [cols as u32, n32, swizzle as u32, 0, 0, 0, 0, 0],
            Step::SiluMul { pairs } => {
                let ff = self.config.n_ff as u32;
                [n32, ff, 2 * ff, if pairs { 1 } else { ff }, 1, pairs as u32, 0, 0]
            }
        }
    }

    fn grid_of(&self, step: Step, n: usize) -> (u32, u32) {
        match step {
            Step::MatMul { rows, .. } => self.ctx.matmul_grid(rows, n),
            Step::MatVec { rows, .. } => self.ctx.matmul_grid(rows, 1),
            // a workgroup per 256 vec4s of a token (rmsnorm.wgsl, rmsnorm_q8.wgsl)
            Step::RmsNorm { dim, .. } => (n as u32, dim.div_ceil(1024) as u32),
            Step::Quantize { cols, .. } => grid_1d(n * cols / 4),
            Step::SiluMul { .. } => grid_1d(n * self.config.n_ff),
        }
    }

    /// The buffers a sequence's bind groups use: (qkv, att, pos, params, rope, xq).
    pub(crate) fn seq_buffers<'a>(&'a self, act: &'a GpuActivations) -> [&'a wgpu::Buffer; 6] {
        [&act.qkv, &act.att, &act.pos, &act.params, &self.rope, &act.xq]
    }
}


/// Layers `[a, b)` of a model on the GPU for one sequence: [`GpuLayers`], its activations and
/// one KV cache, with the cached length tracked here.
pub struct WgpuLayers {
    stack: GpuLayers,
    act: GpuActivations,
    kv: GpuKv,
    /// Positions 0..len of the KV cache are valid.
    len: usize,
}

impl WgpuLayers {
    /// Uploads layers `layers` of `model` with an f16 KV cache of `kv_capacity` positions
    /// (clamped to the trained context), for steps of up to `max_tokens` tokens.
    pub fn new(ctx: Arc<WgpuContext>, model: &Model, layers: Range<usize>, max_tokens: usize, kv_capacity: usize) -> Result<WgpuLayers, WgpuError> {
        WgpuLayers::with_kv(ctx, model, layers, max_tokens, kv_capacity, KvPrecision::F16)
    }

    pub fn with_kv(
        ctx: Arc<WgpuContext>,
        model: &Model,
        layers: Range<usize>,
        max_tokens: usize,
        kv_capacity: usize,
        kv: KvPrecision,
    ) -> Result<WgpuLayers, WgpuError> {
        let capacity = kv_capacity.clamp(1, model.config.n_ctx_train);
        let stack = GpuLayers::new(ctx, model, layers, capacity, kv)?;
        let act = stack.activations(max_tokens)?;
        let kv = stack.new_kv(capacity)?;
        Ok(WgpuLayers { stack, act, kv, len: 0 })
    }

    pub fn layers(&self) -> Range<usize> {
        self.stack.layers()
    }

    /// Valid KV positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity
    }

    pub fn max_tokens(&self) -> usize {
        self.act.max_tokens
    }

    /// Forgets positions `len..` (a rejected draft, a new prompt); the next token goes at `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes of weights and KV cache held on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.stack.weight_bytes() + self.kv.bytes()
    }

    /// Runs this range's layers over `hidden` ([n_tok, n_embd], replaced by the layers' output)
    /// for tokens at `positions`, which must continue the sequence: `len(), len()+1, ...`.
    /// Their keys and values are appended to the GPU KV cache.
    pub fn forward(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<(), WgpuError> {
        self.step(hidden, positions, Prof::Off).map(|_| ())
    }

    /// [`forward`](Self::forward) with GPU timestamps per kind of dispatch (see
    /// [`GpuLayers::forward_measured`]).
    pub fn forward_profiled(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(hidden, positions, Prof::Dispatches)
    }

    /// [`forward`](Self::forward) timed as a whole (see [`GpuLayers::forward_measured`]).
    pub fn forward_timed(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(hidden, positions, Prof::Span)
    }

    fn step(&mut self, hidden: &mut [f32], positions: &[u32], prof: Prof) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        let mut seqs = [SeqSpan { kv: &mut self.kv, start: self.len, n_tok: positions.len() }];
        let r = match prof {
            Prof::Off => {
                self.stack.forward(&mut self.act, hidden, positions, &mut seqs)?;
                None
            }
            _ => self.stack.forward_measured(&mut self.act, hidden, positions, &mut seqs, prof)?,
        };
        self.len += positions.len();
        Ok(r)
    }
}
