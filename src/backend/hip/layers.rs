//! [`HipLayers`]: layers `[a, b)` of a model on a HIP device, the engine's offloaded segment.
//!
//! The weights are uploaded once as the GGUF stores them (q|k|v and gate|up concatenated into
//! one matrix when their types agree, so each is one matmul), with the norms and the CPU's RoPE
//! table. A step (`forward`) uploads the hidden states and one [`TokInfo`](../../../kernels/hip/common.h)
//! per token (position and its sequence's caches), then per layer: RMSNorm (+ q8), q|k|v matmul,
//! RoPE + KV store, attention (chunks, then their merge + q8), o matmul adding into the residual,
//! RMSNorm (+ q8), gate|up matmul, SiLU·mul (+ q8), down matmul adding into the residual; at the
//! end it downloads the hidden states, or with the output head the logits of the chosen rows.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::kernels::{type_info, ActRef, Epi, MatRef, ATT_CH, Q8_BYTES, TOK_BYTES};
use super::kv::HipKv;
use super::runtime::{DevBuf, DevPtr};
use super::{HipContext, HipError, HipOptions};
use crate::backend::cpu::ops::rope_table;
use crate::backend::offload::{missing_parts, LayerOffload, LayerShape, LogitRows, ModelTensors, OffloadActs, OffloadError, OffloadKv, SeqSpan};
use crate::backend::WeightView;

/// Logit rows per round of the output head.
pub const HEAD_ROWS: usize = 64;
/// Most bytes of attention partials one launch may use (longer prefills go in token groups).
const PART_BUDGET: usize = 64 << 20;

fn next_id() -> u64 {
    static ID: AtomicU64 = AtomicU64::new(1);
    ID.fetch_add(1, Ordering::Relaxed)
}

/// A weight matrix on the device.
struct DevMatrix {
    /// owns the device memory `m` points into
    _buf: DevBuf,
    m: MatRef,
}

impl DevMatrix {
    /// Uploads `parts` (same type and width) as one matrix of their rows stacked.
    fn upload(ctx: &HipContext, parts: &[WeightView<'_>]) -> Result<DevMatrix, HipError> {
        let first = parts[0];
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            bytes.extend_from_slice(p.data);
        }
        let buf = DevBuf::from_bytes(ctx.runtime(), &bytes)?;
        let rows = parts.iter().map(|p| p.rows).sum();
        let m = MatRef { ptr: buf.ptr(), ty: first.ty, rows, cols: first.cols, row_bytes: first.row_bytes() };
        Ok(DevMatrix { _buf: buf, m })
    }
}

/// Matrices whose outputs go side by side into one row: one fused matrix when the types agree,
/// else one per part; each with the column its output starts at.
fn upload_group(ctx: &HipContext, parts: &[WeightView<'_>]) -> Result<Vec<(DevMatrix, usize)>, HipError> {
    if parts.iter().all(|p| p.ty == parts[0].ty && p.cols == parts[0].cols) {
        return Ok(vec![(DevMatrix::upload(ctx, parts)?, 0)]);
    }
    let mut at = 0;
    let mut out = Vec::new();
    for p in parts {
        out.push((DevMatrix::upload(ctx, std::slice::from_ref(p))?, at));
        at += p.rows;
    }
    Ok(out)
}

struct HipLayer {
    /// [n_embd] f32
    attn_norm: DevBuf,
    /// q|k|v: [n_head*hd + 2*kv_dim, n_embd]
    qkv: Vec<(DevMatrix, usize)>,
    /// [n_embd, n_head*hd]
    wo: DevMatrix,
    /// [n_embd] f32
    ffn_norm: DevBuf,
    /// gate|up: [2*n_ff, n_embd]
    gate_up: Vec<(DevMatrix, usize)>,
    /// [n_embd, n_ff]
    down: DevMatrix,
}

struct HipHead {
    /// [n_embd] f32
    norm: DevBuf,
    /// [vocab, n_embd]
    out: DevMatrix,
}

/// Layers `[a, b)` of a model on a HIP device (module docs).
pub struct HipLayers {
    id: u64,
    ctx: Arc<HipContext>,
    shape: LayerShape,
    layers: Range<usize>,
    gpu: Vec<HipLayer>,
    /// [n_pos, head_dim / 2, 2] RoPE (cos, sin), the CPU's table
    rope: DevBuf,
    n_pos: usize,
    head: Option<HipHead>,
    opts: HipOptions,
    weight_bytes: u64,
}

/// The parts of `model`'s layers the HIP runner has no kernels for, if any (it runs the plain
/// Llama layer: adjacent-pair RoPE without scaling, SiLU gate, no biases or extra norms, a query
/// as wide as the residual stream, every layer global).
pub fn layers_unsupported(model: &dyn ModelTensors) -> Option<String> {
    missing_parts(model, "HIP", |_| false)
}

/// Checks that the HIP kernels can run a model of this shape and these weight types.
fn check_shape(c: &LayerShape, views: &[WeightView<'_>]) -> Result<(), HipError> {
    let unsupported = |why: String| Err(HipError::Unsupported(why));
    if ![32, 64, 128, 256].contains(&c.head_dim) {
        return unsupported(format!("head_dim {} (the HIP attention takes 32, 64, 128 or 256)", c.head_dim));
    }
    if c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0 {
        return unsupported(format!("{} heads over {} KV heads", c.n_head, c.n_head_kv));
    }
    if c.n_embd % 32 != 0 || c.n_ff % 32 != 0 {
        return unsupported(format!("n_embd {} / n_ff {} not multiples of 32", c.n_embd, c.n_ff));
    }
    if c.rope_dims > c.head_dim {
        return unsupported(format!("RoPE over {} of {} dimensions", c.rope_dims, c.head_dim));
    }
    for v in views {
        let Some(info) = type_info(v.ty) else {
            return unsupported(format!("{} weights (the HIP kernels take F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)", v.ty.name()));
        };
        if v.cols % info.block != 0 {
            return unsupported(format!("a {} matrix of {} columns", v.ty.name(), v.cols));
        }
    }
    Ok(())
}

impl HipLayers {
    /// Uploads layers `layers` of `model` with a RoPE table of `n_pos` positions (the longest KV
    /// cache it will serve); `with_head`: the output norm and projection too (the range must end
    /// the model).
    pub fn new(ctx: Arc<HipContext>, model: &dyn ModelTensors, layers: Range<usize>, n_pos: usize, with_head: bool) -> Result<HipLayers, HipError> {
        let c = model.shape();
        if let Some(why) = layers_unsupported(model) {
            return Err(HipError::Unsupported(why));
        }
        if layers.is_empty() || layers.end > c.n_layer || (with_head && layers.end != c.n_layer) {
            return Err(HipError::Unsupported(format!("layers {}..{} of {} (head: {with_head})", layers.start, layers.end, c.n_layer)));
        }
        let mut views = Vec::new();
        for li in layers.clone() {
            let l = model.layer(li);
            views.extend([l.wq, l.wk, l.wv, l.wo, l.w_gate, l.w_up, l.w_down]);
        }
        if with_head {
            views.push(model.head().output);
        }
        check_shape(&c, &views)?;
        let rt = ctx.runtime().clone();
        let mut gpu = Vec::with_capacity(layers.len());
        for li in layers.clone() {
            let l = model.layer(li);
            gpu.push(HipLayer {
                attn_norm: DevBuf::from_f32(&rt, l.attn_norm)?,
                qkv: upload_group(&ctx, &[l.wq, l.wk, l.wv])?,
                wo: DevMatrix::upload(&ctx, &[l.wo])?,
                ffn_norm: DevBuf::from_f32(&rt, l.ffn_norm)?,
                gate_up: upload_group(&ctx, &[l.w_gate, l.w_up])?,
                down: DevMatrix::upload(&ctx, &[l.w_down])?,
            });
        }
        let head = if with_head {
            let h = model.head();
            Some(HipHead { norm: DevBuf::from_f32(&rt, h.norm)?, out: DevMatrix::upload(&ctx, &[h.output])? })
        } else {
            None
        };
        let n_pos = n_pos.clamp(1, c.n_ctx_train.max(1));
        let rope = DevBuf::from_f32(&rt, &rope_table(n_pos, c.head_dim, c.rope_dims, c.rope_base))?;
        let weight_bytes = views.iter().map(|v| v.data.len() as u64).sum();
        let opts = HipOptions::from_env()?;
        Ok(HipLayers { id: next_id(), ctx, shape: c, layers, gpu, rope, n_pos, head, opts, weight_bytes })
    }

    /// The same segment with every matmul on `tile` (tests; all tiles give the same bits).
    pub fn with_tile(mut self, tile: Option<super::Tile>) -> HipLayers {
        self.opts.tile = tile;
        self
    }

    /// The same segment launching every kernel instead of replaying recorded steps (tests).
    pub fn without_graphs(mut self, off: bool) -> HipLayers {
        self.opts.no_graphs = off;
        self
    }

    pub fn context(&self) -> &Arc<HipContext> {
        &self.ctx
    }

    /// Activation buffers for steps of up to `max_tokens` tokens.
    pub fn activations(&self, max_tokens: usize) -> Result<HipActs, HipError> {
        let c = &self.shape;
        let rt = self.ctx.runtime();
        let m = max_tokens.max(1);
        let (e, qd, kvd, ff) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim(), c.n_ff);
        let f = |n: usize| DevBuf::new(rt, m * n * 4);
        let q = |n: usize| DevBuf::new(rt, m * n / 32 * Q8_BYTES);
        let head = match &self.head {
            None => None,
            Some(_) => {
                let v = c.vocab_size;
                Some(HeadActs {
                    rows: DevBuf::new(rt, HEAD_ROWS * 4)?,
                    hxn: DevBuf::new(rt, HEAD_ROWS * e * 4)?,
                    hxq: DevBuf::new(rt, HEAD_ROWS * e / 32 * Q8_BYTES)?,
                    logits: DevBuf::new(rt, HEAD_ROWS * v * 4)?,
                })
            }
        };
        Ok(HipActs {
            ctx: self.ctx.clone(),
            owner: self.id,
            max_tokens: m,
            x: f(e)?,
            xn: f(e)?,
            xq: q(e)?,
            qkv: f(qd + 2 * kvd)?,
            att: f(qd)?,
            attq: q(qd)?,
            gu: f(2 * ff)?,
            act: f(ff)?,
            actq: q(ff)?,
            tok: DevBuf::new(rt, m * TOK_BYTES)?,
            part: None,
            head,
            host_tok: Vec::with_capacity(m * 3),
            graphs: Vec::new(),
        })
    }

    /// An empty cache of `capacity` positions for one sequence.
    pub fn new_hip_kv(&self, capacity: usize) -> Result<HipKv, HipError> {
        let c = &self.shape;
        HipKv::new(self.ctx.clone(), self.id, self.layers.len(), c.n_head_kv, c.head_dim, capacity.clamp(1, self.n_pos))
    }

    /// One step (see the module docs). `logits`: (rows, out) with the output head.
    pub fn step(&self, a: &mut HipActs, hidden: &mut [f32], positions: &[u32], seqs: &mut [SeqSpan<'_>], logits: Option<(&[u32], &mut [f32])>) -> Result<(), HipError> {
        let c = &self.shape;
        let n = positions.len();
        let e = c.n_embd;
        if a.owner != self.id {
            return Err(HipError::Unsupported("activations of another segment".into()));
        }
        if n == 0 {
            return Ok(());
        }
        if n > a.max_tokens || hidden.len() != n * e || seqs.iter().map(|s| s.n_tok).sum::<usize>() != n {
            return Err(HipError::Unsupported(format!("a step of {n} tokens ({} floats) for buffers of {}", hidden.len(), a.max_tokens)));
        }
        // one TokInfo (3 words) per token: its sequence's caches, capacity and position
        a.host_tok.clear();
        let mut t = 0;
        let mut max_pos = 0;
        for s in seqs.iter() {
            let kv = s.kv.get::<HipKv>().filter(|kv| kv.owner == self.id).ok_or_else(|| HipError::Unsupported("a KV cache of another segment".into()))?;
            let (kp, vp) = kv.ptrs();
            for _ in 0..s.n_tok {
                let pos = positions[t] as usize;
                if pos >= kv.capacity {
                    return Err(HipError::ContextFull { needed: pos + 1, capacity: kv.capacity });
                }
                max_pos = max_pos.max(pos);
                a.host_tok.extend([kp, vp, kv.capacity as u64 | ((pos as u64) << 32)]);
                t += 1;
            }
        }
        let rt = self.ctx.runtime();
        let _stream = self.ctx.lock();
        rt.upload(a.x.ptr(), bytemuck::cast_slice(hidden))?;
        rt.upload(a.tok.ptr(), bytemuck::cast_slice(&a.host_tok))?;
        let chunks = (max_pos + 1).div_ceil(ATT_CH);
        let per_token = c.n_head * chunks * (c.head_dim + 2) * 4;
        let group = (PART_BUDGET / per_token).clamp(1, n);
        let need = group * per_token;
        if a.part.as_ref().is_none_or(|p| p.bytes() < need) {
            a.part = Some(DevBuf::new(rt, need)?);
        }
        // logits of up to HEAD_ROWS rows are computed inside the step (and its graph)
        let head_in_step = match &logits {
            Some((rows, _)) if rows.len() <= HEAD_ROWS => {
                let ha = a.head.as_ref().ok_or_else(|| HipError::Unsupported("logits without an output head".into()))?;
                rt.upload(ha.rows.ptr(), bytemuck::cast_slice(rows))?;
                rows.len()
            }
            _ => 0,
        };
        let key = GraphKey { n, chunks, group, part: a.part.as_ref().map_or(0, |p| p.ptr()), head: head_in_step };
        if self.opts.no_graphs {
            self.record(a, &key)?;
        } else {
            let graph = match a.graphs.iter().find(|g| g.0 == key) {
                Some(g) => g.1,
                None => {
                    if a.graphs.len() >= MAX_GRAPHS {
                        for (_, g) in a.graphs.drain(..) {
                            rt.drop_graph(g);
                        }
                    }
                    rt.begin_capture()?;
                    let recorded = self.record(a, &key);
                    let graph = rt.end_capture();
                    recorded?;
                    let graph = graph?;
                    a.graphs.push((key, graph));
                    graph
                }
            };
            rt.launch_graph(graph)?;
        }
        match logits {
            None => rt.download(bytemuck::cast_slice_mut(hidden), a.x.ptr()),
            Some((_, out)) if head_in_step > 0 => {
                let ha = a.head.as_ref().ok_or_else(|| HipError::Unsupported("logits without an output head".into()))?;
                rt.download(bytemuck::cast_slice_mut(out), ha.logits.ptr())
            }
            // No row wants logits (a prefill chunk before the last): nothing to read back, but the
            // step still returns only once its work is done, like every other step, so its errors
            // surface here and a timer around the next step does not also count this one.
            Some((rows, _)) if rows.is_empty() => rt.sync(),
            Some((rows, out)) => self.head_rounds(a, rows, out),
        }
    }

    /// The kernels of a step: every layer, then the output head of `key.head` rows.
    fn record(&self, a: &HipActs, key: &GraphKey) -> Result<(), HipError> {
        for li in 0..self.gpu.len() {
            self.layer(a, li, key.n, key.chunks, key.group)?;
        }
        if key.head > 0 {
            self.head_kernels(a, key.head)?;
        }
        Ok(())
    }

    fn mm(&self, m: &MatRef, x: ActRef, n: usize, out: DevPtr, ldo: usize, epi: Epi) -> Result<(), HipError> {
        self.ctx.kernels().matmul(&**self.ctx.runtime(), m, x, n, out, ldo, epi, self.opts.tile)
    }

    fn layer(&self, a: &HipActs, li: usize, n: usize, chunks: usize, group: usize) -> Result<(), HipError> {
        let c = &self.shape;
        let (rt, k) = (&**self.ctx.runtime(), self.ctx.kernels());
        let l = &self.gpu[li];
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim(), c.n_ff, c.head_dim);
        let qkvd = qd + 2 * kvd;
        let xin = ActRef { f32: a.xn.ptr(), q8: a.xq.ptr() };
        // each norm writes only the forms of its output that the next matmuls read
        let (f, q) = input_forms(l.qkv.iter().map(|(m, _)| &m.m));
        k.rmsnorm(rt, a.x.ptr(), l.attn_norm.ptr(), e, c.rms_eps, f.then(|| a.xn.ptr()), q.then(|| a.xq.ptr()), n)?;
        for (m, col) in &l.qkv {
            self.mm(&m.m, xin, n, a.qkv.at(col * 4), qkvd, Epi::Store)?;
        }
        k.rope_store(rt, a.qkv.ptr(), c.n_head, c.n_head_kv, hd, self.rope.ptr(), a.tok.ptr(), li, n)?;
        let part = a.part.as_ref().map(|p| p.ptr()).unwrap_or(0);
        for g0 in (0..n).step_by(group) {
            let ng = group.min(n - g0);
            k.attention(
                rt,
                a.qkv.at(g0 * qkvd * 4),
                qkvd,
                (c.n_head, c.n_head_kv, hd),
                a.tok.at(g0 * TOK_BYTES),
                li,
                part,
                chunks,
                a.att.at(g0 * qd * 4),
                Some(a.attq.at(g0 * qd / 32 * Q8_BYTES)),
                ng,
                None,
            )?;
        }
        self.mm(&l.wo.m, ActRef { f32: a.att.ptr(), q8: a.attq.ptr() }, n, a.x.ptr(), e, Epi::Add)?;
        let (f, q) = input_forms(l.gate_up.iter().map(|(m, _)| &m.m));
        k.rmsnorm(rt, a.x.ptr(), l.ffn_norm.ptr(), e, c.rms_eps, f.then(|| a.xn.ptr()), q.then(|| a.xq.ptr()), n)?;
        for (m, col) in &l.gate_up {
            self.mm(&m.m, xin, n, a.gu.at(col * 4), 2 * ff, Epi::Store)?;
        }
        let (f, q) = input_forms([&l.down.m]);
        k.silu_mul_q8(rt, a.gu.ptr(), ff, f.then(|| a.act.ptr()), q.then(|| a.actq.ptr()), n)?;
        self.mm(&l.down.m, ActRef { f32: a.act.ptr(), q8: a.actq.ptr() }, n, a.x.ptr(), e, Epi::Add)
    }

    /// Output norm and logits of the first `k` rows named in the head's row buffer, into its
    /// logits buffer [k, vocab].
    fn head_kernels(&self, a: &HipActs, k: usize) -> Result<(), HipError> {
        let (Some(h), Some(ha)) = (&self.head, &a.head) else { return Err(HipError::Unsupported("logits without an output head".into())) };
        let c = &self.shape;
        let (rt, kr) = (&**self.ctx.runtime(), self.ctx.kernels());
        let (e, v) = (c.n_embd, c.vocab_size);
        // the norm reads the chosen rows of x itself (no gathered copy)
        let (f, q) = input_forms([&h.out.m]);
        kr.rmsnorm_rows(rt, a.x.ptr(), Some(ha.rows.ptr()), h.norm.ptr(), e, c.rms_eps, f.then(|| ha.hxn.ptr()), q.then(|| ha.hxq.ptr()), k, None)?;
        self.mm(&h.out.m, ActRef { f32: ha.hxn.ptr(), q8: ha.hxq.ptr() }, k, ha.logits.ptr(), v, Epi::Store)
    }

    /// Logits of more than HEAD_ROWS rows, HEAD_ROWS at a time, into `out` [rows, vocab].
    fn head_rounds(&self, a: &HipActs, rows: &[u32], out: &mut [f32]) -> Result<(), HipError> {
        let Some(ha) = &a.head else { return Err(HipError::Unsupported("logits without an output head".into())) };
        let rt = &**self.ctx.runtime();
        let v = self.shape.vocab_size;
        if out.len() != rows.len() * v {
            return Err(HipError::Unsupported(format!("{} logits for {} rows of {v}", out.len(), rows.len())));
        }
        for (ids, dst) in rows.chunks(HEAD_ROWS).zip(out.chunks_mut(HEAD_ROWS * v)) {
            rt.upload(ha.rows.ptr(), bytemuck::cast_slice(ids))?;
            self.head_kernels(a, ids.len())?;
            rt.download(bytemuck::cast_slice_mut(dst), ha.logits.ptr())?;
        }
        Ok(())
    }
}

/// What a recorded step depends on besides the buffers of its activations (positions and
/// caches are read from device memory, so one graph serves every decode step of a shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GraphKey {
    n: usize,
    /// attention chunks of the step's longest context
    chunks: usize,
    /// tokens per attention launch
    group: usize,
    /// the partials buffer
    part: DevPtr,
    /// logit rows computed in the step (0: none)
    head: usize,
}

/// Which forms of their input matrices `ms` read: (f32 values, q8 blocks).
fn input_forms<'a>(ms: impl IntoIterator<Item = &'a MatRef>) -> (bool, bool) {
    ms.into_iter().fold((false, false), |(f, q), m| match type_info(m.ty) {
        Some(i) => (f || i.float_act, q || !i.float_act),
        None => (true, true),
    })
}

/// Graphs kept per activations (all dropped when full).
const MAX_GRAPHS: usize = 16;

/// The output head's buffers in a [`HipActs`].
struct HeadActs {
    /// [HEAD_ROWS] u32 step rows
    rows: DevBuf,
    /// [HEAD_ROWS, n_embd] the chosen rows' norm, its q8 blocks
    hxn: DevBuf,
    hxq: DevBuf,
    /// [HEAD_ROWS, vocab]
    logits: DevBuf,
}

/// A segment's activation buffers for steps of up to `max_tokens` tokens (one per run state).
pub struct HipActs {
    ctx: Arc<HipContext>,
    owner: u64,
    max_tokens: usize,
    /// [max_tokens, n_embd] residual stream
    x: DevBuf,
    /// [max_tokens, n_embd] normalized input of a block, and its q8 blocks
    xn: DevBuf,
    xq: DevBuf,
    /// [max_tokens, n_head*hd + 2*kv_dim] q|k|v rows
    qkv: DevBuf,
    /// [max_tokens, n_head*hd] attention output, and its q8 blocks
    att: DevBuf,
    attq: DevBuf,
    /// [max_tokens, 2*n_ff] gate|up rows
    gu: DevBuf,
    /// [max_tokens, n_ff] silu(gate)*up, and its q8 blocks
    act: DevBuf,
    actq: DevBuf,
    /// [max_tokens] TokInfo
    tok: DevBuf,
    /// attention partials, grown to what a step needs
    part: Option<DevBuf>,
    head: Option<HeadActs>,
    /// [max_tokens * 3] TokInfo words of a step (reused: no allocation per step)
    host_tok: Vec<u64>,
    /// recorded steps (graphs), by what they depend on
    graphs: Vec<(GraphKey, usize)>,
}

impl Drop for HipActs {
    fn drop(&mut self) {
        for (_, g) in self.graphs.drain(..) {
            self.ctx.runtime().drop_graph(g);
        }
    }
}

impl HipActs {
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }
}

impl LayerOffload for HipLayers {
    fn device(&self) -> String {
        format!("hip {}", self.ctx.describe())
    }

    fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    fn has_head(&self) -> bool {
        self.head.is_some()
    }

    fn max_positions(&self) -> usize {
        self.n_pos
    }

    fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    fn new_acts(&self, max_tokens: usize) -> Result<OffloadActs, OffloadError> {
        Ok(OffloadActs::new(self.activations(max_tokens)?))
    }

    fn new_kv(&self, capacity: usize) -> Result<OffloadKv, OffloadError> {
        Ok(OffloadKv::new(self.new_hip_kv(capacity)?))
    }

    fn forward(
        &self,
        acts: &mut OffloadActs,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        logits: Option<LogitRows<'_>>,
    ) -> Result<(), OffloadError> {
        let a = acts.get_mut::<HipActs>().ok_or_else(|| HipError::Unsupported("activations of another backend".into()))?;
        let head = logits.map(|l| (l.rows, l.out));
        Ok(self.step(a, hidden, positions, seqs, head)?)
    }
}
