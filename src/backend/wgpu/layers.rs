//! [`WgpuLayers`]: layers `[a, b)` of a Llama model resident on the GPU, for one sequence.
//!
//! Built once: the layers' weights are uploaded as raw GGUF blocks, the KV cache and every
//! activation buffer are allocated for `max_tokens` / `kv_capacity`, and the bind group of every
//! dispatch of a step is created. A step ([`WgpuLayers::forward`]) writes the hidden state, the
//! positions and the per-step parameters, records all dispatches of all its layers in one compute
//! pass of one command buffer, and reads back only the final hidden state `[n_tok, n_embd]`.
//! Embedding, the output norm, logits and sampling stay with the caller (the CPU).

use std::ops::Range;
use std::sync::Arc;

use super::context::{grid_1d, Kernel, WgpuContext, MAX_HEAD_DIM};
use super::WgpuError;
use crate::backend::cpu::ops::rope_table;
use crate::engine::weights::Matrix;
use crate::engine::{LlamaConfig, Model};
use crate::gguf::GgmlType;

/// Element type of the GPU KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvPrecision {
    /// f16, as the CPU engine's cache (half the memory).
    F16,
    F32,
}

/// Weight rows on the GPU: one matrix, or several of one type stacked (q|k|v, gate|up) so that
/// a single dispatch computes them all.
struct GpuMatrix {
    /// [rows, row_bytes] raw GGUF blocks
    buf: wgpu::Buffer,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    /// First output column of these rows in the destination row.
    y_off: usize,
}

struct GpuLayer {
    /// [n_embd] f32
    attn_norm: wgpu::Buffer,
    /// wq|wk|wv stacked when they share a type, else the three
    qkv: Vec<GpuMatrix>,
    wo: GpuMatrix,
    /// [n_embd] f32
    ffn_norm: wgpu::Buffer,
    /// w_gate|w_up stacked when they share a type, else the two
    gate_up: Vec<GpuMatrix>,
    w_down: GpuMatrix,
    /// [n_head_kv, capacity, head_dim] f16 pairs or f32, as u32 words
    k_cache: wgpu::Buffer,
    /// [n_head_kv, capacity, head_dim] same as k_cache
    v_cache: wgpu::Buffer,
}

/// What one dispatch computes; with the batch size it gives the parameters and the grid.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    /// `accumulate`: add into the destination (the residual stream) instead of writing.
    MatMul { rows: usize, cols: usize, row_bytes: usize, y_stride: usize, y_off: usize, accumulate: bool },
    RmsNorm { dim: usize, eps: f32 },
    /// RoPE on the query and key heads of the q|k|v rows.
    Rope,
    KvStore,
    Attention,
    SiluMul,
}

/// One recorded dispatch: pipeline, bind group (with its parameter slot), what it computes.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    step: Step,
    /// For profiles: "attention", "matmul qkv", ...
    label: &'static str,
}

pub struct WgpuLayers {
    ctx: Arc<WgpuContext>,
    config: LlamaConfig,
    layers: Range<usize>,
    kv: KvPrecision,
    max_tokens: usize,
    capacity: usize,
    /// Positions 0..len of the KV cache are valid.
    len: usize,
    gpu: Vec<GpuLayer>,
    /// [max_tokens, n_embd] residual stream (in and out)
    x: wgpu::Buffer,
    /// [max_tokens] u32 position of each token of the step
    pos: wgpu::Buffer,
    /// [kv_capacity, head_dim / 2, 2] RoPE (cos, sin) table
    _rope: wgpu::Buffer,
    /// [n_slots] parameter slots, `ctx.uniform_align` bytes apart
    params: wgpu::Buffer,
    /// [max_tokens, n_embd] f32, MAP_READ
    staging: wgpu::Buffer,
    /// distinct steps; slot i of `params` holds the parameters of `slots[i]`
    slots: Vec<Step>,
    /// every dispatch of a step, in order
    dispatches: Vec<Dispatch>,
    /// activation buffers, kept alive for the bind groups: xn [max, n_embd],
    /// qkv [max, n_head*hd + 2*kv_dim], att [max, n_head*hd], gu [max, 2*n_ff], act [max, n_ff]
    _activations: Vec<wgpu::Buffer>,
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
        let c = model.config.clone();
        if layers.start > layers.end || layers.end > c.n_layer {
            return Err(WgpuError::Unsupported(format!("layers {layers:?} of a {}-layer model", c.n_layer)));
        }
        if c.head_dim % 2 != 0 || c.head_dim > MAX_HEAD_DIM || c.n_embd % 4 != 0 {
            return Err(WgpuError::Unsupported(format!("head_dim {} / n_embd {}", c.head_dim, c.n_embd)));
        }
        let max_tokens = max_tokens.max(1);
        let capacity = kv_capacity.clamp(1, c.n_ctx_train);
        let (e, qd, kvd, ff, hd) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim(), c.n_ff, c.head_dim);
        let kv_bytes = (c.n_head_kv * capacity * hd * if kv == KvPrecision::F16 { 2 } else { 4 }) as u64;
        let f32s = |n: usize| (n * 4) as u64;

        let mut gpu = Vec::with_capacity(layers.len());
        for li in layers.clone() {
            let lw = &model.weights.layers[li];
            let norm = |v: &[f32], name: &str| ctx.storage_init(&format!("blk.{li}.{name}"), bytemuck::cast_slice(v));
            gpu.push(GpuLayer {
                attn_norm: norm(&lw.attn_norm, "attn_norm")?,
                qkv: upload_rows(&ctx, model, &[&lw.wq, &lw.wk, &lw.wv], &format!("blk.{li}.attn_qkv"))?,
                wo: upload_rows(&ctx, model, &[&lw.wo], &format!("blk.{li}.attn_output"))?.remove(0),
                ffn_norm: norm(&lw.ffn_norm, "ffn_norm")?,
                gate_up: upload_rows(&ctx, model, &[&lw.w_gate, &lw.w_up], &format!("blk.{li}.ffn_gate_up"))?,
                w_down: upload_rows(&ctx, model, &[&lw.w_down], &format!("blk.{li}.ffn_down"))?.remove(0),
                k_cache: ctx.storage("k_cache", kv_bytes)?,
                v_cache: ctx.storage("v_cache", kv_bytes)?,
            });
        }
        let qkvd = qd + 2 * kvd;
        let x = ctx.storage("x", f32s(max_tokens * e))?;
        let [xn, qkv, att, gu, act] = [e, qkvd, qd, 2 * ff, ff].map(|w| ctx.storage("activation", f32s(max_tokens * w)));
        let (xn, qkv, att, gu, act) = (xn?, qkv?, att?, gu?, act?);
        let pos = ctx.storage("pos", (max_tokens * 4) as u64)?;
        let rope = ctx.storage_init("rope", bytemuck::cast_slice(&rope_table(capacity, hd, c.rope_dims, c.rope_base)))?;
        let staging = ctx.staging("staging", f32s(max_tokens * e));

        // The steps of each layer with their buffers (binding 1.. of each kernel).
        let kern = &ctx.kernels;
        let mut plan: Vec<(&Kernel, Step, &'static str, Vec<&wgpu::Buffer>)> = Vec::new();
        for g in &gpu {
            let mm = |w: &GpuMatrix, y_stride: usize, accumulate: bool| Step::MatMul {
                rows: w.rows,
                cols: w.cols,
                row_bytes: w.row_bytes,
                y_stride,
                y_off: w.y_off,
                accumulate,
            };
            let mmk = |w: &GpuMatrix| kern.matmul.get(&w.ty).ok_or_else(|| WgpuError::Unsupported(w.ty.name().into()));
            let norm = Step::RmsNorm { dim: e, eps: c.rms_eps };
            plan.push((&kern.rmsnorm, norm, "rmsnorm", vec![&x, &g.attn_norm, &xn]));
            for w in &g.qkv {
                plan.push((mmk(w)?, mm(w, qkvd, false), "matmul qkv", vec![&w.buf, &xn, &qkv]));
            }
            plan.push((&kern.rope, Step::Rope, "rope", vec![&qkv, &rope, &pos]));
            plan.push((&kern.kv_store, Step::KvStore, "kv_store", vec![&qkv, &qkv, &g.k_cache, &g.v_cache, &pos]));
            plan.push((&kern.attention, Step::Attention, "attention", vec![&qkv, &g.k_cache, &g.v_cache, &pos, &att]));
            plan.push((mmk(&g.wo)?, mm(&g.wo, e, true), "matmul o + add", vec![&g.wo.buf, &att, &x]));
            plan.push((&kern.rmsnorm, norm, "rmsnorm", vec![&x, &g.ffn_norm, &xn]));
            for w in &g.gate_up {
                plan.push((mmk(w)?, mm(w, 2 * ff, false), "matmul gate_up", vec![&w.buf, &xn, &gu]));
            }
            plan.push((&kern.silu_mul, Step::SiluMul, "silu_mul", vec![&gu, &gu, &act]));
            plan.push((mmk(&g.w_down)?, mm(&g.w_down, e, true), "matmul down + add", vec![&g.w_down.buf, &act, &x]));
        }
        let mut slots: Vec<Step> = Vec::new();
        for (_, s, _, _) in &plan {
            if !slots.contains(s) {
                slots.push(*s);
            }
        }
        let params = ctx.params("layer params", slots.len());
        let dispatches = plan
            .iter()
            .map(|(kernel, step, label, bufs)| {
                let slot = slots.iter().position(|s| s == step).unwrap_or(0) as u64;
                let mut binds = vec![(&params, slot * ctx.uniform_align, Some(32))];
                binds.extend(bufs.iter().map(|b| (*b, 0, None)));
                Dispatch { pipeline: kernel.pipeline.clone(), bind: ctx.bind(kernel, &binds), step: *step, label }
            })
            .collect();
        ctx.check()?;
        Ok(WgpuLayers {
            config: c,
            layers,
            kv,
            max_tokens,
            capacity,
            len: 0,
            gpu,
            x,
            pos,
            _rope: rope,
            params,
            staging,
            slots,
            dispatches,
            _activations: vec![xn, qkv, att, gu, act],
            ctx,
        })
    }

    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// Valid KV positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Forgets positions `len..` (a rejected draft, a new prompt); the next token goes at `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes of weights and KV cache held on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.gpu
            .iter()
            .map(|g| {
                g.qkv.iter().chain(&g.gate_up).chain([&g.wo, &g.w_down]).map(|m| m.buf.size()).sum::<u64>()
                    + g.k_cache.size()
                    + g.v_cache.size()
            })
            .sum()
    }

    /// Runs this range's layers over `hidden` ([n_tok, n_embd], replaced by the layers' output)
    /// for tokens at `positions`, which must continue the sequence: `len(), len()+1, ...`.
    /// Their keys and values are appended to the GPU KV cache.
    pub fn forward(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<(), WgpuError> {
        self.step(hidden, positions, false).map(|_| ())
    }

    /// [`forward`](Self::forward) with each dispatch in its own compute pass between GPU
    /// timestamps: milliseconds of GPU time per kind of dispatch, in order of first appearance.
    /// `None` (after a plain forward) when the adapter has no timestamp queries.
    pub fn forward_profiled(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(hidden, positions, self.ctx.timestamps)
    }

    fn step(&mut self, hidden: &mut [f32], positions: &[u32], profile: bool) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        let n = positions.len();
        let e = self.config.n_embd;
        if n > self.max_tokens {
            return Err(WgpuError::BatchTooLarge { got: n, max: self.max_tokens });
        }
        if hidden.len() != n * e {
            return Err(WgpuError::BadShape { got: hidden.len(), expected: n * e });
        }
        if let Some((i, &p)) = positions.iter().enumerate().find(|&(i, &p)| p as usize != self.len + i) {
            return Err(WgpuError::BadPositions { expected: self.len + i, got: p });
        }
        if self.len + n > self.capacity {
            return Err(WgpuError::ContextFull { needed: self.len + n, capacity: self.capacity });
        }
        if n == 0 {
            return Ok(None);
        }
        let ctx = &self.ctx;
        ctx.queue.write_buffer(&self.x, 0, bytemuck::cast_slice(hidden));
        ctx.queue.write_buffer(&self.pos, 0, bytemuck::cast_slice(positions));
        let stride = ctx.uniform_align as usize / 4;
        let mut words = vec![0u32; self.slots.len() * stride];
        for (slot, step) in self.slots.iter().enumerate() {
            let p = self.params_of(*step, n);
            words[slot * stride..slot * stride + 8].copy_from_slice(&p);
        }
        ctx.queue.write_buffer(&self.params, 0, bytemuck::cast_slice(&words));

        let mut enc = ctx.encoder();
        let queries = profile.then(|| {
            ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * self.dispatches.len() as u32,
            })
        });
        if let Some(qs) = &queries {
            for (i, d) in self.dispatches.iter().enumerate() {
                let writes = wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: Some(2 * i as u32),
                    end_of_pass_write_index: Some(2 * i as u32 + 1),
                };
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(d.label), timestamp_writes: Some(writes) });
                self.record(&mut pass, d, n);
            }
        } else {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("layers"), timestamp_writes: None });
            for d in &self.dispatches {
                self.record(&mut pass, d, n);
            }
        }
        ctx.submit_and_read(enc, &self.x, 0, &self.staging, hidden)?;
        self.len += n;
        let Some(qs) = queries else { return Ok(None) };

        let bytes = 16 * self.dispatches.len() as u64;
        let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = ctx.encoder();
        enc.resolve_query_set(&qs, 0..2 * self.dispatches.len() as u32, &resolved, 0);
        let mut ticks = vec![0u64; 2 * self.dispatches.len()];
        ctx.map_read(enc, &resolved, 0, &ctx.staging("timestamps", bytes), bytes, |b| ticks.copy_from_slice(bytemuck::cast_slice(b)))?;
        let ns_per_tick = f64::from(ctx.queue.get_timestamp_period());
        let mut out: Vec<(&'static str, f64)> = Vec::new();
        for (d, t) in self.dispatches.iter().zip(ticks.chunks_exact(2)) {
            let ms = t[1].saturating_sub(t[0]) as f64 * ns_per_tick / 1e6;
            match out.iter_mut().find(|(l, _)| *l == d.label) {
                Some((_, total)) => *total += ms,
                None => out.push((d.label, ms)),
            }
        }
        Ok(Some(out))
    }

    fn record(&self, pass: &mut wgpu::ComputePass<'_>, d: &Dispatch, n: usize) {
        let (gx, gy) = self.grid_of(d.step, n);
        pass.set_pipeline(&d.pipeline);
        pass.set_bind_group(0, &d.bind, &[]);
        pass.dispatch_workgroups(gx, gy, 1);
    }

    /// The uniform parameters of `step` for a batch of `n` tokens (layouts in the .wgsl headers).
    fn params_of(&self, step: Step, n: usize) -> [u32; 8] {
        let c = &self.config;
        let (n32, hd, qd, kvd) = (n as u32, c.head_dim as u32, (c.n_head * c.head_dim) as u32, c.kv_dim() as u32);
        match step {
            Step::MatMul { rows, cols, row_bytes, y_stride, y_off, accumulate } => {
                [rows as u32, cols as u32, n32, row_bytes as u32, y_stride as u32, y_off as u32, accumulate as u32, 0]
            }
            Step::RmsNorm { dim, eps } => [dim as u32, n32, eps.to_bits(), 0, 0, 0, 0, 0],
            Step::Rope => [n32, (c.n_head + c.n_head_kv) as u32, hd, qd + 2 * kvd, 0, 0, 0, 0],
            Step::KvStore => [n32, c.n_head_kv as u32, hd, self.capacity as u32, self.kv_f16(), qd + 2 * kvd, qd, qd + kvd],
            Step::Attention => {
                let scale = 1.0 / (c.head_dim as f32).sqrt();
                [n32, c.n_head as u32, c.n_head_kv as u32, hd, self.capacity as u32, self.kv_f16(), scale.to_bits(), qd + 2 * kvd]
            }
            Step::SiluMul => [n32, c.n_ff as u32, 2 * c.n_ff as u32, c.n_ff as u32, 0, 0, 0, 0],
        }
    }

    fn kv_f16(&self) -> u32 {
        (self.kv == KvPrecision::F16) as u32
    }

    fn grid_of(&self, step: Step, n: usize) -> (u32, u32) {
        let c = &self.config;
        match step {
            Step::MatMul { rows, .. } => self.ctx.matmul_grid(rows, n),
            Step::RmsNorm { .. } => (n as u32, 1),
            Step::Rope => grid_1d(n * (c.n_head + c.n_head_kv) * c.head_dim / 2),
            Step::KvStore => grid_1d(n * c.n_head_kv * c.head_dim / 2),
            Step::Attention => (c.n_head as u32, n as u32),
            Step::SiluMul => grid_1d(n * c.n_ff),
        }
    }
}

/// Uploads matrices that feed one destination row (q|k|v or gate|up): stacked in one buffer when
/// they share a type (one dispatch), else one buffer each; `y_off` places each in the row.
fn upload_rows(ctx: &WgpuContext, model: &Model, mats: &[&Matrix], name: &str) -> Result<Vec<GpuMatrix>, WgpuError> {
    let views: Vec<_> = mats.iter().map(|m| m.view(&model.gguf)).collect();
    if let Some(v) = views.iter().find(|v| v.cols % 32 != 0 || v.cols != views[0].cols) {
        return Err(WgpuError::Unsupported(format!("{name}: rows of {} values (need a multiple of 32, all alike)", v.cols)));
    }
    let gm = |buf, ty, rows, v: &crate::backend::WeightView<'_>, y_off| GpuMatrix { buf, ty, rows, cols: v.cols, row_bytes: v.row_bytes(), y_off };
    if views.iter().all(|v| v.ty == views[0].ty) {
        let parts: Vec<&[u8]> = views.iter().map(|v| v.data).collect();
        let rows = views.iter().map(|v| v.rows).sum();
        return Ok(vec![gm(ctx.storage_concat(name, &parts)?, views[0].ty, rows, &views[0], 0)]);
    }
    let mut y_off = 0;
    views
        .iter()
        .map(|v| {
            let m = gm(ctx.storage_init(name, v.data)?, v.ty, v.rows, v, y_off);
            y_off += v.rows;
            Ok(m)
        })
        .collect()
}
