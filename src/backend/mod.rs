//! Compute backends. The forward pass (`engine::model`) talks to one narrow trait,
//! [`Backend`]: the handful of kernels a Llama/BERT layer needs, on host-visible f32
//! activations and read-only weight views. Capability queries ([`Backend::supports`]) say what a
//! backend can run; nothing panics for an unsupported op.
//!
//! A second seam serves accelerators that hold whole layers: [`offload::LayerOffload`], through
//! which the engine runs layers `[a, b)` of a model on a device, their activations and each
//! sequence's KV behind opaque handles (`offload` module docs). Everything a backend needs from
//! the model comes through types of that module, so nothing here imports the engine.
//!
//! * `cpu` — scalar reference kernels (kept forever, the ground truth for every other kernel)
//!   plus SIMD variants chosen at run time.
//! * `wgpu` — WGSL kernels: the `Backend` trait op by op, and `GpuLayers`, a `LayerOffload`
//!   segment; every knob in `WgpuOptions`.
//! * `hip` — `.hip` kernels (kernels/hip) on a discrete GPU: HIP on AMD, the same sources through
//!   the CUDA driver API on NVIDIA, behind one small runtime interface; `HipLayers` is a
//!   `LayerOffload` segment, `HipBackend` the `Backend` trait op by op (tests).
//! * `offload` — the layer-offload interface (wgpu and HIP implement it).
//! * `hardware` — detection of CPU features and GPUs, and the execution tier derived from them.
//! * `simd` — the CPU instruction-set levels (`SimdLevel`), shared by `hardware` and `cpu`.
//!
//! Batch invariance: every kernel computes a token's output with the same reduction order
//! whether it is alone or in a batch, so logits and KV are bitwise identical across decode,
//! prefill and reuse (tests in `tests/batch_invariance.rs`).

pub mod cpu;
pub mod hardware;
pub mod hip;
pub mod offload;
pub mod simd;
#[cfg(test)]
mod tests;
pub mod wgpu;

use crate::gguf::GgmlType;

use self::offload::FfnActivation;

/// Operations of the forward pass, for capability queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    MatMul,
    RmsNorm,
    LayerNorm,
    Rope,
    Attention,
    SiluMul,
    Gelu,
    Add,
    Embed,
}

/// A weight matrix in GGML layout: `rows` rows of `cols` elements, each row whole blocks of `ty`.
/// `y = W x` maps `cols` inputs to `rows` outputs.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    /// block type of the rows
    pub ty: GgmlType,
    /// number of rows (outputs)
    pub rows: usize,
    /// elements per row (inputs)
    pub cols: usize,
    /// [rows, row_bytes(cols)]
    pub data: &'a [u8],
    /// The same matrix in the layout of a backend's kernels, if [`Backend::prepare`] made one
    /// (only the backend that made it reads it; others ignore it).
    pub prepared: Option<&'a Prepared>,
}

impl<'a> WeightView<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements of `ty`.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Option<Self> {
        let rb = ty.row_bytes(cols)?;
        (rb.checked_mul(rows)? == data.len()).then_some(WeightView { ty, rows, cols, data, prepared: None })
    }

    /// The same view with a backend's prepared copy attached.
    pub fn with_prepared(self, prepared: Option<&'a Prepared>) -> Self {
        WeightView { prepared, ..self }
    }

    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// A backend's own copy of a weight matrix, laid out for its kernels (the CPU's AVX-512 level:
/// rows interleaved 16 at a time, `cpu::x16`), made once at load by [`Backend::prepare`] and
/// kept by the model beside the mapped weights. Opaque to everyone but the backend that made it.
pub struct Prepared {
    /// the backend's layout (it downcasts)
    pub data: Box<dyn std::any::Any + Send + Sync>,
    /// bytes of memory it holds
    pub bytes: usize,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prepared({} bytes)", self.bytes)
    }
}

/// Attention over one sequence's KV cache for one layer.
/// Keys and values are f16, laid out per KV head: `[n_kv_head, capacity, head_dim]`.
pub struct AttentionArgs<'a> {
    /// [n_tok, n_head * head_dim] queries (RoPE applied)
    pub q: &'a [f32],
    /// [n_kv_head, capacity, head_dim]
    pub k_cache: &'a [half::f16],
    /// [n_kv_head, capacity, head_dim]
    pub v_cache: &'a [half::f16],
    /// positions the cache holds per KV head
    pub capacity: usize,
    /// position of each query token; it attends to keys 0..=pos
    pub positions: &'a [u32],
    /// number of query heads
    pub n_head: usize,
    /// number of KV heads (grouped-query attention: n_head a multiple of it)
    pub n_kv_head: usize,
    /// elements per head
    pub head_dim: usize,
    /// Sliding window: a query at position p sees keys p + 1 - window ..= p only (GGML's
    /// standard SWA); `None`: every key up to p.
    pub window: Option<usize>,
    /// [n_tok, n_head * head_dim]
    pub out: &'a mut [f32],
}

impl AttentionArgs<'_> {
    /// The keys token `t` attends to (a range of cache positions).
    pub fn keys_of(&self, t: usize) -> std::ops::Range<usize> {
        attention_keys(self.positions[t], self.window)
    }
}

/// The keys a query at `pos` attends to: `pos + 1 - window ..= pos` with a sliding window,
/// else `0 ..= pos`.
pub fn attention_keys(pos: u32, window: Option<usize>) -> std::ops::Range<usize> {
    let end = pos as usize + 1;
    match window {
        Some(w) => end.saturating_sub(w.max(1))..end,
        None => 0..end,
    }
}

/// The kernels a transformer forward pass needs. All activations are row-major `[n_tok, dim]`.
pub trait Backend: Send + Sync {
    /// Human-readable name, e.g. "cpu-avx2 (2 threads)".
    fn name(&self) -> String;

    /// Whether this backend can run `op` on weights / data of type `ty`.
    fn supports(&self, op: Op, ty: GgmlType) -> bool;

    /// A copy of `w` in a layout this backend's kernels read faster, made once when a model
    /// loads (the caller keeps it and attaches it to later views of `w`); `None`: the mapped
    /// layout is used as it is. Must not change any result.
    fn prepare(&self, w: WeightView<'_>) -> Option<Prepared> {
        let _ = w;
        None
    }

    /// `out[t, r] = sum_c W[r, c] * x[t, c]` for `n_tok` tokens.
    /// x: [n_tok, w.cols], out: [n_tok, w.rows]
    fn matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]);

    /// Several matmuls of the same input (e.g. Q, K and V), which a backend may run as one
    /// parallel region. `outs[m]`: [n_tok, ws[m].rows].
    fn matmul_multi(&self, ws: &[WeightView<'_>], x: &[f32], n_tok: usize, outs: &mut [&mut [f32]]) {
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            self.matmul(*w, x, n_tok, o);
        }
    }

    /// A gated feed-forward input: `gate = act(W_gate · x) · (W_up · x)`, with `up` as scratch
    /// (both [n_tok, rows]); a backend may apply the activation to each row as it is computed.
    /// The same bits as [`Backend::matmul_multi`] then [`Backend::gated_act`], which is what
    /// this default does.
    #[allow(clippy::too_many_arguments)]
    fn matmul_gated(&self, gate_w: WeightView<'_>, up_w: WeightView<'_>, x: &[f32], n_tok: usize, act: FfnActivation, gate: &mut [f32], up: &mut [f32]) {
        self.matmul_multi(&[gate_w, up_w], x, n_tok, &mut [&mut *gate, &mut *up]);
        self.gated_act(act, gate, up);
    }

    /// gate = act(gate) · up: [`Backend::silu_mul`] or [`Backend::gelu_tanh_mul`].
    fn gated_act(&self, act: FfnActivation, gate: &mut [f32], up: &[f32]) {
        match act {
            FfnActivation::Silu => self.silu_mul(gate, up),
            FfnActivation::GeluTanh => self.gelu_tanh_mul(gate, up),
        }
    }

    /// A residual projection: `x += W · a`, with `proj` as scratch (x, proj: [n_tok, w.rows]); a
    /// backend may add each row as it is computed. The same bits as [`Backend::matmul`] into
    /// `proj` then [`Backend::add`], which is what this default does.
    fn matmul_add(&self, w: WeightView<'_>, a: &[f32], n_tok: usize, proj: &mut [f32], x: &mut [f32]) {
        self.matmul(w, a, n_tok, proj);
        self.add(x, proj);
    }

    /// RMSNorm per token: out = x / sqrt(mean(x^2) + eps) * weight. x, out: [n_tok, dim]
    fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]);

    /// LayerNorm per token (BERT): out = (x - mean) / sqrt(var + eps) * weight + bias.
    fn layernorm(&self, x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]);

    /// Rotary embedding on adjacent pairs (GGML "normal" mode) of every head, in place.
    /// x: [n_tok, n_head * head_dim]; `cos_sin[pos]` holds head_dim/2 (cos, sin) pairs.
    fn rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]);

    /// Rotary embedding on the halves of the first `rope_dims` dimensions of every head (GGML's
    /// NeoX mode: pairs (i, i + rope_dims/2)), in place; arguments as [`Backend::rope`].
    fn rope_neox(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, rope_dims: usize, cos_sin: &[f32]) {
        for (tok, &pos) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
            let cs = &cos_sin[pos as usize * head_dim..(pos as usize + 1) * head_dim];
            for h in tok.chunks_exact_mut(head_dim) {
                cpu::ops::rope_head_neox(h, cs, rope_dims);
            }
        }
    }

    /// Causal attention for a batch of query tokens of one sequence (keys in position order).
    fn attention(&self, args: AttentionArgs<'_>);

    /// gate = silu(gate) * up, elementwise.
    fn silu_mul(&self, gate: &mut [f32], up: &[f32]);

    /// gate = gelu_tanh(gate) * up, elementwise (GeGLU).
    fn gelu_tanh_mul(&self, gate: &mut [f32], up: &[f32]) {
        for (g, u) in gate.iter_mut().zip(up) {
            *g = cpu::ops::gelu_tanh(*g) * u;
        }
    }

    /// x = gelu(x) (erf form), elementwise.
    fn gelu(&self, x: &mut [f32]);

    /// x += y, elementwise.
    fn add(&self, x: &mut [f32], y: &[f32]);

    /// Rows `ids` of `table`, dequantized: `out[t, :]` = row `ids[t]` (the embedding lookup).
    /// Exact: each row is `gguf::dequantize_row`'s, whoever computes it. Every id must be a row of
    /// the table and `out` hold `ids.len() * table.cols` values (the caller checks both).
    fn dequantize_rows(&self, table: WeightView<'_>, ids: &[u32], out: &mut [f32]) {
        dequantize_rows_in_order(table, ids, out);
    }
}

/// [`Backend::dequantize_rows`] one row after another: the default, and each run of the CPU
/// backend's parallel split.
pub(crate) fn dequantize_rows_in_order(table: WeightView<'_>, ids: &[u32], out: &mut [f32]) {
    for (o, &id) in out.chunks_exact_mut(table.cols).zip(ids) {
        crate::gguf::dequantize_row(table.ty, table.row(id as usize), o);
    }
}
