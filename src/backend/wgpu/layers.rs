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

/// A weight matrix on the GPU.
struct GpuMatrix {
    /// [rows, row_bytes] raw GGUF blocks
    buf: wgpu::Buffer,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

struct GpuLayer {
    /// [n_embd] f32
    attn_norm: wgpu::Buffer,
    wq: GpuMatrix,
    wk: GpuMatrix,
    wv: GpuMatrix,
    wo: GpuMatrix,
    /// [n_embd] f32
    ffn_norm: wgpu::Buffer,
    w_gate: GpuMatrix,
    w_up: GpuMatrix,
    w_down: GpuMatrix,
    /// [n_head_kv, capacity, head_dim] f16 pairs or f32, as u32 words
    k_cache: wgpu::Buffer,
    /// [n_head_kv, capacity, head_dim] same as k_cache
    v_cache: wgpu::Buffer,
}

/// What one dispatch computes; with the batch size it gives the parameters and the grid.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Step {
    MatMul { rows: usize, cols: usize, row_bytes: usize },
    RmsNorm { dim: usize, eps: f32 },
    Rope { n_head: usize },
    KvStore,
    Attention,
    SiluMul,
    Add,
}

/// One recorded dispatch: pipeline, bind group (with its parameter slot), what it computes.
struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind: wgpu::BindGroup,
    step: Step,
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
    /// [n_steps] parameter slots, `ctx.uniform_align` bytes apart
    params: wgpu::Buffer,
    /// [max_tokens, n_embd] f32, MAP_READ
    staging: wgpu::Buffer,
    /// distinct steps; slot i of `params` holds the parameters of `slots[i]`
    slots: Vec<Step>,
    /// every dispatch of a step, in order
    dispatches: Vec<Dispatch>,
    /// activation buffers, kept alive for the bind groups: xn [max, n_embd], q [max, n_head*hd],
    /// k, v [max, kv_dim], att [max, n_head*hd], proj [max, n_embd], gate, up [max, n_ff]
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
            let m = |w: &Matrix, name: &str| upload_matrix(&ctx, model, w, &format!("blk.{li}.{name}"));
            let norm = |v: &[f32], name: &str| ctx.storage_init(&format!("blk.{li}.{name}"), bytemuck::cast_slice(v));
            gpu.push(GpuLayer {
                attn_norm: norm(&lw.attn_norm, "attn_norm")?,
                wq: m(&lw.wq, "attn_q")?,
                wk: m(&lw.wk, "attn_k")?,
                wv: m(&lw.wv, "attn_v")?,
                wo: m(&lw.wo, "attn_output")?,
                ffn_norm: norm(&lw.ffn_norm, "ffn_norm")?,
                w_gate: m(&lw.w_gate, "ffn_gate")?,
                w_up: m(&lw.w_up, "ffn_up")?,
                w_down: m(&lw.w_down, "ffn_down")?,
                k_cache: ctx.storage("k_cache", kv_bytes)?,
                v_cache: ctx.storage("v_cache", kv_bytes)?,
            });
        }
        let x = ctx.storage("x", f32s(max_tokens * e))?;
        let [xn, q, k, v, att, proj, gate, up] = [e, qd, kvd, kvd, qd, e, ff, ff].map(|w| ctx.storage("activation", f32s(max_tokens * w)));
        let (xn, q, k, v, att, proj, gate, up) = (xn?, q?, k?, v?, att?, proj?, gate?, up?);
        let pos = ctx.storage("pos", (max_tokens * 4) as u64)?;
        let rope = ctx.storage_init("rope", bytemuck::cast_slice(&rope_table(capacity, hd, c.rope_dims, c.rope_base)))?;
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("staging"),
            size: f32s(max_tokens * e),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });

        // The steps of each layer with their buffers (binding 1.. of each kernel).
        let kern = &ctx.kernels;
        let mut plan: Vec<(&Kernel, Step, Vec<&wgpu::Buffer>)> = Vec::new();
        for g in &gpu {
            let mm = |w: &GpuMatrix| Step::MatMul { rows: w.rows, cols: w.cols, row_bytes: w.row_bytes };
            let mmk = |w: &GpuMatrix| kern.matmul.get(&w.ty).ok_or_else(|| WgpuError::Unsupported(w.ty.name().into()));
            let norm = Step::RmsNorm { dim: e, eps: c.rms_eps };
            plan.push((&kern.rmsnorm, norm, vec![&x, &g.attn_norm, &xn]));
            plan.push((mmk(&g.wq)?, mm(&g.wq), vec![&g.wq.buf, &xn, &q]));
            plan.push((mmk(&g.wk)?, mm(&g.wk), vec![&g.wk.buf, &xn, &k]));
            plan.push((mmk(&g.wv)?, mm(&g.wv), vec![&g.wv.buf, &xn, &v]));
            plan.push((&kern.rope, Step::Rope { n_head: c.n_head }, vec![&q, &rope, &pos]));
            plan.push((&kern.rope, Step::Rope { n_head: c.n_head_kv }, vec![&k, &rope, &pos]));
            plan.push((&kern.kv_store, Step::KvStore, vec![&k, &v, &g.k_cache, &g.v_cache, &pos]));
            plan.push((&kern.attention, Step::Attention, vec![&q, &g.k_cache, &g.v_cache, &pos, &att]));
            plan.push((mmk(&g.wo)?, mm(&g.wo), vec![&g.wo.buf, &att, &proj]));
            plan.push((&kern.add, Step::Add, vec![&x, &proj]));
            plan.push((&kern.rmsnorm, norm, vec![&x, &g.ffn_norm, &xn]));
            plan.push((mmk(&g.w_gate)?, mm(&g.w_gate), vec![&g.w_gate.buf, &xn, &gate]));
            plan.push((mmk(&g.w_up)?, mm(&g.w_up), vec![&g.w_up.buf, &xn, &up]));
            plan.push((&kern.silu_mul, Step::SiluMul, vec![&gate, &up]));
            plan.push((mmk(&g.w_down)?, mm(&g.w_down), vec![&g.w_down.buf, &gate, &proj]));
            plan.push((&kern.add, Step::Add, vec![&x, &proj]));
        }
        let mut slots: Vec<Step> = Vec::new();
        for (_, s, _) in &plan {
            if !slots.contains(s) {
                slots.push(*s);
            }
        }
        let params = ctx.params("layer params", slots.len());
        let dispatches = plan
            .iter()
            .map(|(kernel, step, bufs)| {
                let slot = slots.iter().position(|s| s == step).unwrap_or(0) as u64;
                let mut binds = vec![(&params, slot * ctx.uniform_align, Some(32))];
                binds.extend(bufs.iter().map(|b| (*b, 0, None)));
                Dispatch { pipeline: kernel.pipeline.clone(), bind: ctx.bind(kernel, &binds), step: *step }
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
            _activations: vec![xn, q, k, v, att, proj, gate, up],
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
                [&g.wq, &g.wk, &g.wv, &g.wo, &g.w_gate, &g.w_up, &g.w_down].iter().map(|m| m.buf.size()).sum::<u64>()
                    + g.k_cache.size()
                    + g.v_cache.size()
            })
            .sum()
    }

    /// Runs this range's layers over `hidden` ([n_tok, n_embd], replaced by the layers' output)
    /// for tokens at `positions`, which must continue the sequence: `len(), len()+1, ...`.
    /// Their keys and values are appended to the GPU KV cache.
    pub fn forward(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<(), WgpuError> {
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
            return Ok(());
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
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("layers"), timestamp_writes: None });
            for d in &self.dispatches {
                let (gx, gy) = self.grid_of(d.step, n);
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &d.bind, &[]);
                pass.dispatch_workgroups(gx, gy, 1);
            }
        }
        ctx.submit_and_read(enc, &self.x, 0, &self.staging, hidden)?;
        self.len += n;
        Ok(())
    }

    /// The uniform parameters of `step` for a batch of `n` tokens (layouts in the .wgsl headers).
    fn params_of(&self, step: Step, n: usize) -> [u32; 8] {
        let c = &self.config;
        let n32 = n as u32;
        match step {
            Step::MatMul { rows, cols, row_bytes } => [rows as u32, cols as u32, n32, row_bytes as u32, 0, 0, 0, 0],
            Step::RmsNorm { dim, eps } => [dim as u32, n32, eps.to_bits(), 0, 0, 0, 0, 0],
            Step::Rope { n_head } => [n32, n_head as u32, c.head_dim as u32, 0, 0, 0, 0, 0],
            Step::KvStore => [n32, c.n_head_kv as u32, c.head_dim as u32, self.capacity as u32, self.kv_f16(), 0, 0, 0],
            Step::Attention => {
                let scale = 1.0 / (c.head_dim as f32).sqrt();
                let (h, kvh, hd) = (c.n_head as u32, c.n_head_kv as u32, c.head_dim as u32);
                [n32, h, kvh, hd, self.capacity as u32, self.kv_f16(), scale.to_bits(), 0]
            }
            Step::SiluMul => [(n * c.n_ff) as u32, 0, 0, 0, 0, 0, 0, 0],
            Step::Add => [(n * c.n_embd) as u32, 0, 0, 0, 0, 0, 0, 0],
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
            Step::Rope { n_head } => grid_1d(n * n_head * c.head_dim / 2),
            Step::KvStore => grid_1d(n * c.n_head_kv * c.head_dim / 2),
            Step::Attention => (c.n_head as u32, n as u32),
            Step::SiluMul => grid_1d(n * c.n_ff),
            Step::Add => grid_1d(n * c.n_embd),
        }
    }
}

fn upload_matrix(ctx: &WgpuContext, model: &Model, w: &Matrix, name: &str) -> Result<GpuMatrix, WgpuError> {
    let view = w.view(&model.gguf);
    if view.cols % 32 != 0 {
        return Err(WgpuError::Unsupported(format!("{name}: rows of {} values (need a multiple of 32)", view.cols)));
    }
    Ok(GpuMatrix {
        buf: ctx.storage_init(name, view.data)?,
        ty: view.ty,
        rows: view.rows,
        cols: view.cols,
        row_bytes: view.row_bytes(),
    })
}
