//! [`WgpuBackend`]: the [`Backend`] trait on the WGSL kernels, one op at a time (upload the
//! inputs, one dispatch, read the result back). It exists to test every kernel against the CPU
//! reference and for callers that want single ops; the fast path is [`super::WgpuLayers`].
//!
//! The trait's methods cannot fail, so a GPU error is kept (see [`WgpuBackend::take_error`]) and
//! that call's result is computed by the CPU reference instead. LayerNorm and GELU have no WGSL
//! kernel: `supports` says so and those two run on the host reference.

use std::sync::{Arc, Mutex};

use half::f16;
use wgpu::util::DeviceExt;

use super::context::{grid_1d, WgpuContext, MAX_HEAD_DIM, WEIGHT_TYPES};
use super::pipeline::Kernel;
use super::kv::window_param;
use super::WgpuError;
use crate::backend::cpu::ops;
use crate::backend::{AttentionArgs, Backend, Op, WeightView};
use crate::gguf::{dequantize_row, GgmlType};

pub struct WgpuBackend {
    ctx: Arc<WgpuContext>,
    /// The first GPU error since the last `take_error`.
    error: Mutex<Option<WgpuError>>,
}

/// An input or output of one dispatch.
enum Arg<'a> {
    Bytes(&'a [u8]),
    /// A zeroed buffer of this many bytes.
    Zeroed(u64),
}

impl WgpuBackend {
    pub fn new(ctx: Arc<WgpuContext>) -> WgpuBackend {
        WgpuBackend { ctx, error: Mutex::new(None) }
    }

    pub fn context(&self) -> &Arc<WgpuContext> {
        &self.ctx
    }

    /// The first GPU error since the last call (its op's result came from the CPU reference).
    pub fn take_error(&self) -> Option<WgpuError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn keep(&self, r: Result<(), WgpuError>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                let mut s = self.error.lock().unwrap_or_else(|p| p.into_inner());
                s.get_or_insert(e);
                false
            }
        }
    }

    /// Uploads `args`, runs `kernel` once over (params, args...) on `grid` workgroups and reads
    /// binding `out` (an index into `args`) back into `dst`.
    fn run(&self, kernel: &Kernel, params: &[u32], args: &[Arg<'_>], grid: (u32, u32), out: usize, dst: &mut [f32]) -> Result<(), WgpuError> {
        let ctx = &self.ctx;
        let mut p = params.to_vec();
        p.resize(params.len().div_ceil(4) * 4, 0);
        let pbuf = ctx.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(&p),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let bufs = args
            .iter()
            .map(|a| match a {
                Arg::Bytes(b) => ctx.storage_init("arg", b),
                Arg::Zeroed(n) => ctx.storage("arg", *n),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut binds = vec![(&pbuf, 0, None)];
        binds.extend(bufs.iter().map(|b| (b, 0, None)));
        let bg = ctx.bind(kernel, &binds);
        let mut enc = ctx.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
            pass.set_pipeline(&kernel.pipeline);
            pass.set_bind_group(0, &bg, if kernel.dynamic { &[0] } else { &[] });
            pass.dispatch_workgroups(grid.0, grid.1, 1);
        }
        ctx.read_f32(enc, &bufs[out], 0, dst)
    }

    /// `out[t, r] = sum_c W[r, c] x[t, c]` on the GPU. Float weights whose `cols` is not a
    /// multiple of 32 are zero-padded on upload (the kernels work in 32-element chunks).
    pub fn try_matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<(), WgpuError> {
        let (rows, cols) = (w.rows, w.cols);
        if x.len() != n_tok * cols || out.len() != n_tok * rows {
            return Err(WgpuError::BadShape { got: x.len(), expected: n_tok * cols });
        }
        if n_tok == 0 || rows == 0 {
            return Ok(());
        }
        let cols32 = cols.div_ceil(32) * 32;
        let (wbytes, xpad);
        let (wdata, xdata): (&[u8], &[f32]) = if cols32 == cols {
            (w.data, x)
        } else {
            let es = w.ty.block_bytes();
            let mut b = vec![0u8; rows * cols32 * es];
            for r in 0..rows {
                b[r * cols32 * es..][..cols * es].copy_from_slice(w.row(r));
            }
            let mut xp = vec![0f32; n_tok * cols32];
            for t in 0..n_tok {
                xp[t * cols32..][..cols].copy_from_slice(&x[t * cols..(t + 1) * cols]);
            }
            (wbytes, xpad) = (b, xp);
            (&wbytes, &xpad)
        };
        // matmul.wgsl reads each token's row chunk-major (see its header).
        let xdata = swizzle_rows(xdata, cols32);
        let row_bytes = super::pack::row_param(w.ty, cols32, wdata.len() / rows) as u32;
        let packed = super::pack::pack_rows(w.ty, cols32, &[wdata]);
        let kernel = self.ctx.kernels.matmul.get(&w.ty).ok_or_else(|| WgpuError::Unsupported(w.ty.name().into()))?;
        let grid = self.ctx.matmul_grid(rows, n_tok);
        let params = [rows as u32, cols32 as u32, n_tok as u32, row_bytes, rows as u32, 0, 0, 0];
        let args = [Arg::Bytes(&packed), Arg::Bytes(bytemuck::cast_slice(&xdata)), Arg::Zeroed((out.len() * 4) as u64)];
        self.run(kernel, &params, &args, grid, 2, out)
    }

    /// Embedding lookup: `out[t, :]` = row `ids[t]` of `table`, dequantized on the GPU.
    pub fn embed(&self, table: WeightView<'_>, ids: &[u32], out: &mut [f32]) -> Result<(), WgpuError> {
        let cols = table.cols;
        if out.len() != ids.len() * cols {
            return Err(WgpuError::BadShape { got: out.len(), expected: ids.len() * cols });
        }
        if cols % 32 != 0 {
            return Err(WgpuError::Unsupported(format!("embedding rows of {cols} values (need a multiple of 32)")));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(WgpuError::Unsupported(format!("token id {id} outside a table of {} rows", table.rows)));
        }
        if ids.is_empty() {
            return Ok(());
        }
        let kernel = self.ctx.kernels.embed.get(&table.ty).ok_or_else(|| WgpuError::Unsupported(table.ty.name().into()))?;
        let params = [cols as u32, ids.len() as u32, table.row_bytes() as u32, 0];
        let args = [Arg::Bytes(table.data), Arg::Bytes(bytemuck::cast_slice(ids)), Arg::Zeroed((out.len() * 4) as u64)];
        self.run(kernel, &params, &args, grid_1d(ids.len() * cols / 32), 2, out)
    }

    pub fn try_rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), WgpuError> {
        let d = weight.len();
        if d == 0 || x.len() % d != 0 || out.len() != x.len() {
            return Err(WgpuError::BadShape { got: x.len(), expected: out.len() });
        }
        if !d.is_multiple_of(4) {
            return Err(WgpuError::Unsupported(format!("rmsnorm of rows of {d} values (rmsnorm.wgsl reads vec4s)")));
        }
        let n = x.len() / d;
        // rms_bind.wgsl: dim, n_tok, eps, swizzle (plain rows), add (off)
        let params = [d as u32, n as u32, eps.to_bits(), 0, 0, 0, 0, 0];
        let args = [Arg::Bytes(bytemuck::cast_slice(x)), Arg::Bytes(bytemuck::cast_slice(weight)), Arg::Zeroed((x.len() * 4) as u64)];
        self.run(&self.ctx.kernels.rmsnorm, &params, &args, (n as u32, d.div_ceil(1024) as u32), 2, out)
    }

    pub fn try_rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) -> Result<(), WgpuError> {
        self.try_rope_mode(x, positions, (n_head, head_dim, head_dim), false, cos_sin)
    }

    /// RoPE in GGML's NeoX mode (pairs i, i + rope_dims/2) through rope.wgsl.
    pub fn try_rope_neox(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, rope_dims: usize, cos_sin: &[f32]) -> Result<(), WgpuError> {
        self.try_rope_mode(x, positions, (n_head, head_dim, rope_dims), true, cos_sin)
    }

    /// rope.wgsl over `x` ([n_tok, n_head * head_dim]); `heads` = (n_head, head_dim, rope_dims).
    fn try_rope_mode(&self, x: &mut [f32], positions: &[u32], heads: (usize, usize, usize), neox: bool, cos_sin: &[f32]) -> Result<(), WgpuError> {
        let (n_head, head_dim, rope_dims) = heads;
        let n = positions.len();
        if x.len() != n * n_head * head_dim || head_dim % 2 != 0 || rope_dims % 2 != 0 || rope_dims > head_dim {
            return Err(WgpuError::BadShape { got: x.len(), expected: n * n_head * head_dim });
        }
        if positions.iter().any(|&p| (p as usize + 1) * head_dim > cos_sin.len()) {
            return Err(WgpuError::Unsupported("position beyond the RoPE table".into()));
        }
        let input = x.to_vec();
        let params = [n as u32, n_head as u32, head_dim as u32, (n_head * head_dim) as u32, rope_dims as u32, neox as u32, 0, 0];
        let args = [Arg::Bytes(bytemuck::cast_slice(&input)), Arg::Bytes(bytemuck::cast_slice(cos_sin)), Arg::Bytes(bytemuck::cast_slice(positions))];
        let pairs = if neox { rope_dims / 2 } else { head_dim / 2 };
        self.run(&self.ctx.kernels.rope, &params, &args, grid_1d(n * n_head * pairs), 0, x)
    }

    pub fn try_attention(&self, a: &mut AttentionArgs<'_>) -> Result<(), WgpuError> {
        let (n, hd) = (a.positions.len(), a.head_dim);
        if hd % 8 != 0 || hd > MAX_HEAD_DIM || a.n_kv_head == 0 || a.n_head % a.n_kv_head != 0 {
            return Err(WgpuError::Unsupported(format!("attention with head_dim {hd}, {} heads, {} KV heads", a.n_head, a.n_kv_head)));
        }
        if a.positions.iter().any(|&p| p as usize >= a.capacity) || a.q.len() != n * a.n_head * hd {
            return Err(WgpuError::BadShape { got: a.q.len(), expected: n * a.n_head * hd });
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let params =
            [n as u32, 0, a.n_head as u32, a.n_kv_head as u32, hd as u32, a.capacity as u32, 1, (a.n_head * hd) as u32, scale.to_bits(), 0, 0, 0, window_param(a.window)];
        let bits = |c: &[f16]| c.iter().map(|h| h.to_bits()).collect::<Vec<u16>>();
        let (kc, vc) = (bits(a.k_cache), bits(a.v_cache));
        let args = [
            Arg::Bytes(bytemuck::cast_slice(a.q)),
            Arg::Bytes(bytemuck::cast_slice(&kc)),
            Arg::Bytes(bytemuck::cast_slice(&vc)),
            Arg::Bytes(bytemuck::cast_slice(a.positions)),
            Arg::Zeroed((a.out.len() * 4) as u64),
            // Q8 output, unused (q8_out = 0)
            Arg::Zeroed(16),
            // chunk partials, unused (one workgroup per (head, token) walks every chunk)
            Arg::Zeroed(16),
        ];
        match self.ctx.attention_kv(a.n_head, a.n_kv_head, hd, n) {
            Some((kv, grid)) => self.run(kv, &params, &args, grid, 4, a.out),
            None => self.run(&self.ctx.kernels.attention, &params, &args, (a.n_head as u32, n as u32), 4, a.out),
        }
    }

    /// quantize_q8.wgsl over `x` ([n_tok, cols], cols a multiple of 32; `swizzled`: each row in
    /// the f32 matmul input's (mm_x_f32.wgsl) chunk-major layout): the Q8 rows' words (q8_act.wgsl's layout).
    pub fn quantize_q8(&self, x: &[f32], n_tok: usize, cols: usize, swizzled: bool) -> Result<Vec<u32>, WgpuError> {
        if !cols.is_multiple_of(32) || x.len() != n_tok * cols {
            return Err(WgpuError::BadShape { got: x.len(), expected: n_tok * cols });
        }
        let words = (super::plan::q8_bytes(n_tok, cols) / 4) as usize;
        let mut out = vec![0f32; words];
        let args = [Arg::Bytes(bytemuck::cast_slice(x)), Arg::Zeroed((words * 4) as u64)];
        let params = [cols as u32, n_tok as u32, swizzled as u32, 0];
        self.run(&self.ctx.kernels.quantize_q8, &params, &args, grid_1d(n_tok * cols / 4), 1, &mut out)?;
        Ok(out.iter().map(|v| v.to_bits()).collect())
    }

    /// Runs kv_store.wgsl: keys and values `[n_tok, n_kv_head * head_dim]` written at `positions`
    /// into zeroed caches `[n_kv_head, capacity, head_dim]`; returns the raw cache words
    /// (f16 pairs when `f16`, else f32 bits).
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &self,
        k: &[f32],
        v: &[f32],
        positions: &[u32],
        n_kv_head: usize,
        head_dim: usize,
        capacity: usize,
        f16: bool,
    ) -> Result<(Vec<u32>, Vec<u32>), WgpuError> {
        let n = positions.len();
        if k.len() != n * n_kv_head * head_dim || v.len() != k.len() || head_dim % 2 != 0 {
            return Err(WgpuError::BadShape { got: k.len(), expected: n * n_kv_head * head_dim });
        }
        if positions.iter().any(|&p| p as usize >= capacity) {
            return Err(WgpuError::ContextFull { needed: capacity + 1, capacity });
        }
        let words = n_kv_head * capacity * head_dim / if f16 { 2 } else { 1 };
        let params = [n as u32, n_kv_head as u32, head_dim as u32, capacity as u32, f16 as u32, (n_kv_head * head_dim) as u32, 0, 0];
        let grid = grid_1d(n * n_kv_head * head_dim / 2);
        let mut out = [vec![0f32; words], vec![0f32; words]];
        for (i, o) in out.iter_mut().enumerate() {
            let args = [
                Arg::Bytes(bytemuck::cast_slice(k)),
                Arg::Bytes(bytemuck::cast_slice(v)),
                Arg::Zeroed((words * 4) as u64),
                Arg::Zeroed((words * 4) as u64),
                Arg::Bytes(bytemuck::cast_slice(positions)),
            ];
            self.run(&self.ctx.kernels.kv_store, &params, &args, grid, 2 + i, o)?;
        }
        let [kc, vc] = out.map(|o| o.into_iter().map(f32::to_bits).collect());
        Ok((kc, vc))
    }

    pub fn try_silu_mul(&self, gate: &mut [f32], up: &[f32]) -> Result<(), WgpuError> {
        self.try_gated(gate, up, false)
    }

    /// gate = gelu_tanh(gate) * up (GeGLU) through silu_mul.wgsl.
    pub fn try_gelu_tanh_mul(&self, gate: &mut [f32], up: &[f32]) -> Result<(), WgpuError> {
        self.try_gated(gate, up, true)
    }

    fn try_gated(&self, gate: &mut [f32], up: &[f32], gelu: bool) -> Result<(), WgpuError> {
        if gate.len() != up.len() {
            return Err(WgpuError::BadShape { got: up.len(), expected: gate.len() });
        }
        if gate.is_empty() {
            return Ok(());
        }
        let input = gate.to_vec();
        let params = [1, gate.len() as u32, gate.len() as u32, 0, 0, 0, gelu as u32, 0];
        let args = [Arg::Bytes(bytemuck::cast_slice(&input)), Arg::Bytes(bytemuck::cast_slice(up)), Arg::Zeroed((gate.len() * 4) as u64)];
        self.run(&self.ctx.kernels.silu_mul, &params, &args, grid_1d(gate.len()), 2, gate)
    }

    pub fn try_add(&self, x: &mut [f32], y: &[f32]) -> Result<(), WgpuError> {
        if x.len() != y.len() {
            return Err(WgpuError::BadShape { got: y.len(), expected: x.len() });
        }
        if x.is_empty() {
            return Ok(());
        }
        let input = x.to_vec();
        let params = [x.len() as u32, 0, 0, 0];
        let args = [Arg::Bytes(bytemuck::cast_slice(&input)), Arg::Bytes(bytemuck::cast_slice(y))];
        self.run(&self.ctx.kernels.add, &params, &args, grid_1d(x.len()), 0, x)
    }
}

/// Rows of `width` values (a multiple of 32) in the f32 matmul input's (mm_x_f32.wgsl) chunk-major layout: element
/// 32c + 4k + i of a row goes to 4 * (k * width / 32 + c) + i.
pub(crate) fn swizzle_rows(x: &[f32], width: usize) -> Vec<f32> {
    let nc = width / 32;
    let mut out = vec![0f32; x.len()];
    for (row, dst) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        for (e, &v) in row.iter().enumerate() {
            dst[((e >> 2 & 7) * nc + (e >> 5)) * 4 + (e & 3)] = v;
        }
    }
    out
}

/// Host reference for a failed matmul: dequantized rows, f32 dots.
fn host_matmul(w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        dequantize_row(w.ty, w.row(r), &mut row);
        for t in 0..n_tok {
            out[t * w.rows + r] = row.iter().zip(&x[t * w.cols..(t + 1) * w.cols]).map(|(a, b)| a * b).sum();
        }
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> String {
        let a = self.ctx.adapter();
        let coop = if self.ctx.coop() { ", Q4_0 on tensor cores" } else { "" };
        format!("wgpu ({}, {}, {}, {} matmul lanes, decode: {}{coop})", a.name, a.device_type, a.backend, self.ctx.matmul_lanes(), self.ctx.decode_kernels())
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::MatMul | Op::Embed => WEIGHT_TYPES.contains(&ty),
            Op::RmsNorm | Op::Rope | Op::Attention | Op::SiluMul | Op::Add => ty == GgmlType::F32,
            Op::LayerNorm | Op::Gelu => false,
        }
    }

    fn matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
        if !self.keep(self.try_matmul(w, x, n_tok, out)) {
            host_matmul(w, x, n_tok, out);
        }
    }

    fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        if !self.keep(self.try_rmsnorm(x, weight, eps, out)) {
            for (o, xs) in out.chunks_exact_mut(weight.len()).zip(x.chunks_exact(weight.len())) {
                ops::rmsnorm(xs, weight, eps, o);
            }
        }
    }

    fn layernorm(&self, x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
        for (o, xs) in out.chunks_exact_mut(weight.len()).zip(x.chunks_exact(weight.len())) {
            ops::layernorm(xs, weight, bias, eps, o);
        }
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) {
        let before = x.to_vec();
        if !self.keep(self.try_rope(x, positions, n_head, head_dim, cos_sin)) {
            x.copy_from_slice(&before);
            for (tok, &pos) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
                let cs = &cos_sin[pos as usize * head_dim..(pos as usize + 1) * head_dim];
                tok.chunks_exact_mut(head_dim).for_each(|h| ops::rope_head(h, cs));
            }
        }
    }

    fn rope_neox(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, rope_dims: usize, cos_sin: &[f32]) {
        let before = x.to_vec();
        if !self.keep(self.try_rope_neox(x, positions, n_head, head_dim, rope_dims, cos_sin)) {
            x.copy_from_slice(&before);
            for (tok, &pos) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
                let cs = &cos_sin[pos as usize * head_dim..(pos as usize + 1) * head_dim];
                tok.chunks_exact_mut(head_dim).for_each(|h| ops::rope_head_neox(h, cs, rope_dims));
            }
        }
    }

    fn attention(&self, mut a: AttentionArgs<'_>) {
        if !self.keep(self.try_attention(&mut a)) {
            let (hd, group, cap) = (a.head_dim, a.n_head / a.n_kv_head.max(1), a.capacity);
            let scale = 1.0 / (hd as f32).sqrt();
            for (i, out) in a.out.chunks_exact_mut(hd).enumerate() {
                let (t, h) = (i / a.n_head, i % a.n_head);
                let r = crate::backend::attention_keys(a.positions[t], a.window);
                let n_keys = r.len();
                let base = (h / group) * cap * hd;
                let (k, v): (&[f16], &[f16]) = (&a.k_cache[base + r.start * hd..base + r.end * hd], &a.v_cache[base + r.start * hd..base + r.end * hd]);
                ops::attend_head(&a.q[i * hd..(i + 1) * hd], k, v, n_keys, scale, out);
            }
        }
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        let before = gate.to_vec();
        if !self.keep(self.try_silu_mul(gate, up)) {
            for ((g, b), u) in gate.iter_mut().zip(before).zip(up) {
                *g = ops::silu(b) * u;
            }
        }
    }

    fn gelu_tanh_mul(&self, gate: &mut [f32], up: &[f32]) {
        let before = gate.to_vec();
        if !self.keep(self.try_gelu_tanh_mul(gate, up)) {
            for ((g, b), u) in gate.iter_mut().zip(before).zip(up) {
                *g = ops::gelu_tanh(b) * u;
            }
        }
    }

    fn gelu(&self, x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = ops::gelu(*v));
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        let before = x.to_vec();
        if !self.keep(self.try_add(x, y)) {
            for ((a, b), c) in x.iter_mut().zip(before).zip(y) {
                *a = b + c;
            }
        }
    }
}
