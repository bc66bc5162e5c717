//! The layer-offload interface: how the engine runs layers `[a, b)` of a model on an accelerator.
//!
//! The engine keeps a list of offloaded segments (`Box<dyn LayerOffload>`, one per run of layers
//! on one device) and runs the other layers itself; every backend that can hold layers (wgpu
//! today, HIP next) implements [`LayerOffload`]. The engine never looks inside what a segment
//! keeps per run state and per sequence: [`OffloadActs`] (activation buffers for steps of up to
//! `max_tokens` tokens) and [`OffloadKv`] (one sequence's keys and values for the segment's
//! layers) are opaque handles that only the backend that made them opens. The engine owns the
//! cached length of a sequence (so truncating is forgetting positions) and asks the handle to copy
//! a prefix between two sequences, on the device.
//!
//! What a backend needs to build a segment comes through [`ModelTensors`] (the engine's `Model`
//! implements it): the shape numbers ([`LayerShape`]) and each layer's tensors as views into the
//! GGUF map ([`LayerTensors`], [`HeadTensors`]). So layers point down: the engine imports this
//! module and the backends, no backend imports the engine.
//!
//! The shape follows llama.cpp's split between `ggml-backend-impl.h` (a backend behind a table of
//! functions, buffers behind an opaque context) and `llama-memory.h` (the sequence memory behind
//! its own interface: remove, copy a prefix).

use std::any::Any;
use std::ops::Range;

use super::WeightView;

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): GGML's "normal" mode (Llama).
    Adjacent,
    /// Halves (x[i], x[i + rope_dims/2]): GGML's NeoX mode (Qwen, Gemma, Phi-3).
    Neox,
}

/// The feed-forward activation: `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU (SwiGLU).
    Silu,
    /// GELU, tanh form (GeGLU).
    GeluTanh,
}

/// Hyper-parameters a layer runner needs (numbers only; the engine fills them from its config).
/// The fields after `n_ctx_train` are the optional parts of some architectures; a runner that
/// lacks one refuses the model by naming it.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerShape {
    /// Number of transformer blocks in the model.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Width of the FFN's hidden layer.
    pub n_ff: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads.
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Leading dimensions of a head that RoPE rotates (pairs: GGML's "normal" mode).
    pub rope_dims: usize,
    /// RoPE base (theta) of the global layers.
    pub rope_base: f32,
    /// Epsilon of the RMS norms.
    pub rms_eps: f32,
    /// Rows of the output head (tokens in the vocabulary).
    pub vocab_size: usize,
    /// Context length the model was trained for (the longest RoPE table a segment needs).
    pub n_ctx_train: usize,
    /// How RoPE pairs the dimensions of a head.
    pub rope_style: RopeStyle,
    /// Linear RoPE scaling of the global layers: positions × this (1: none).
    pub rope_freq_scale: f32,
    /// RoPE base of the sliding-window layers.
    pub rope_base_swa: f32,
    /// Keys a sliding-window layer attends to (the query's own position and the ones before).
    pub sliding_window: Option<usize>,
    /// [n_layer] whether each layer attends within `sliding_window` only (else globally).
    pub swa_layers: Vec<bool>,
    /// Query scale in attention (1/√head_dim for every architecture here but Gemma 3 27B).
    pub attn_scale: f32,
    /// Activation of the FFN gate (SiLU, or GELU tanh for Gemma 3).
    pub ffn_activation: FfnActivation,
    /// logits = c · tanh(logits / c), for a segment with the output head.
    pub final_softcap: Option<f32>,
}

impl LayerShape {
    /// Width of the K (and V) projection: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the Q projection and the attention output: n_head * head_dim.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The window of layer `li`, if it is a sliding-window layer.
    pub fn window(&self, li: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.swa_layers.get(li).copied().unwrap_or(false))
    }
}

/// One transformer block's weights: views into the GGUF map (never copied).
#[derive(Debug, Clone, Copy)]
pub struct LayerTensors<'a> {
    /// [n_embd]
    pub attn_norm: &'a [f32],
    /// [n_head * head_dim, n_embd]
    pub wq: WeightView<'a>,
    /// [n_head_kv * head_dim, n_embd]
    pub wk: WeightView<'a>,
    /// [n_head_kv * head_dim, n_embd]
    pub wv: WeightView<'a>,
    /// [n_embd, n_head * head_dim]
    pub wo: WeightView<'a>,
    /// [n_embd]
    pub ffn_norm: &'a [f32],
    /// [n_ff, n_embd]
    pub w_gate: WeightView<'a>,
    /// [n_ff, n_embd]
    pub w_up: WeightView<'a>,
    /// [n_embd, n_ff]
    pub w_down: WeightView<'a>,
    /// [n_head * head_dim], [n_head_kv * head_dim] x 2: biases of q, k, v (Qwen2)
    pub bq: Option<&'a [f32]>,
    /// [n_head_kv * head_dim] bias of k (Qwen2)
    pub bk: Option<&'a [f32]>,
    /// [n_head_kv * head_dim] bias of v (Qwen2)
    pub bv: Option<&'a [f32]>,
    /// [head_dim] per-head RMSNorm weights of q and of k, before RoPE (Qwen3, Gemma 3)
    pub q_norm: Option<&'a [f32]>,
    /// [head_dim] per-head RMSNorm weight of k, before RoPE (Qwen3, Gemma 3)
    pub k_norm: Option<&'a [f32]>,
    /// [n_embd] RMSNorm of the attention / FFN output before its residual add (Gemma)
    pub post_attn_norm: Option<&'a [f32]>,
    /// [n_embd] RMSNorm of the FFN output before its residual add (Gemma)
    pub post_ffn_norm: Option<&'a [f32]>,
}

/// The output norm and projection (for a segment that ends the model and computes logits).
#[derive(Debug, Clone, Copy)]
pub struct HeadTensors<'a> {
    /// [n_embd]
    pub norm: &'a [f32],
    /// [vocab, n_embd]
    pub output: WeightView<'a>,
}

/// A model as a backend sees it when it builds a segment.
pub trait ModelTensors {
    fn shape(&self) -> LayerShape;
    /// Layer `li`'s tensors (`li < shape().n_layer`).
    fn layer(&self, li: usize) -> LayerTensors<'_>;
    fn head(&self) -> HeadTensors<'_>;
    /// [rope_dims / 2] RoPE frequency factors of the global layers (Llama 3's
    /// `rope_freqs.weight`), if the model has them.
    fn rope_freqs(&self) -> Option<&[f32]>;
}

/// A part of a layer's computation beyond the plain Llama layer (adjacent-pair RoPE without
/// scaling, SiLU gate, no biases or extra norms, a query as wide as the residual stream, every
/// layer global). Each GPU layer runner names the parts it runs; [`missing_parts`] says which a
/// model needs that a runner lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerPart {
    /// NeoX-style RoPE (pairs i, i + d/2) over the whole head.
    NeoxRope,
    /// NeoX-style RoPE over only part of a head.
    PartialNeoxRope,
    /// RoPE frequency scaling or per-frequency factors.
    RopeScaling,
    /// Layers attending only to a window of recent positions.
    SlidingWindow,
    /// GeGLU gate instead of SiLU.
    GeGlu,
    /// Soft-capped logits.
    SoftCap,
    /// A query scale other than 1/sqrt(head_dim).
    QueryScale,
    /// n_head * head_dim larger than n_embd.
    WideQueries,
    /// Biases on q, k or v.
    QkvBias,
    /// Per-head RMS norms on both q and k.
    QkNorms,
    /// A norm on q or k but not on both.
    LoneQkNorm,
    /// RMS norms after attention and after the FFN.
    PostNorms,
}

impl LayerPart {
    /// The part as a reason names it.
    pub fn name(self) -> &'static str {
        match self {
            LayerPart::NeoxRope => "NeoX RoPE",
            LayerPart::PartialNeoxRope => "NeoX RoPE over part of a head",
            LayerPart::RopeScaling => "RoPE scaling",
            LayerPart::SlidingWindow => "sliding-window layers",
            LayerPart::GeGlu => "GeGLU",
            LayerPart::SoftCap => "logit soft-capping",
            LayerPart::QueryScale => "a query scale other than 1/sqrt(head_dim)",
            LayerPart::WideQueries => "queries wider than the residual stream",
            LayerPart::QkvBias => "q/k/v biases",
            LayerPart::QkNorms => "q/k norms",
            LayerPart::LoneQkNorm => "a q norm without a k norm (or the reverse)",
            LayerPart::PostNorms => "post-attention / post-FFN norms",
        }
    }
}

/// The parts beyond the plain Llama layer that `model`'s layers need.
pub fn layer_parts(model: &dyn ModelTensors) -> Vec<LayerPart> {
    let c = model.shape();
    let mut parts = Vec::new();
    let mut need = |yes: bool, part| {
        if yes {
            parts.push(part)
        }
    };
    let neox = c.rope_style == RopeStyle::Neox;
    need(neox && c.rope_dims == c.head_dim, LayerPart::NeoxRope);
    need(neox && c.rope_dims != c.head_dim, LayerPart::PartialNeoxRope);
    need(c.rope_freq_scale != 1.0 || model.rope_freqs().is_some(), LayerPart::RopeScaling);
    need((0..c.n_layer).any(|li| c.window(li).is_some()), LayerPart::SlidingWindow);
    need(c.ffn_activation != FfnActivation::Silu, LayerPart::GeGlu);
    need(c.final_softcap.is_some(), LayerPart::SoftCap);
    need(c.attn_scale != 1.0 / (c.head_dim as f32).sqrt(), LayerPart::QueryScale);
    need(c.q_dim() != c.n_embd, LayerPart::WideQueries);
    if c.n_layer > 0 {
        let l = model.layer(0);
        need(l.bq.is_some() || l.bk.is_some() || l.bv.is_some(), LayerPart::QkvBias);
        need(l.q_norm.is_some() && l.k_norm.is_some(), LayerPart::QkNorms);
        need(l.q_norm.is_some() != l.k_norm.is_some(), LayerPart::LoneQkNorm);
        need(l.post_attn_norm.is_some() || l.post_ffn_norm.is_some(), LayerPart::PostNorms);
    }
    parts
}

/// Why runner `runner` ("wgpu", "HIP") cannot run `model`'s layers: the parts they need that
/// `runs` says it has no kernels for; `None` when it has them all.
pub fn missing_parts(model: &dyn ModelTensors, runner: &str, runs: impl Fn(LayerPart) -> bool) -> Option<String> {
    let lacks: Vec<&str> = layer_parts(model).into_iter().filter(|&p| !runs(p)).map(LayerPart::name).collect();
    (!lacks.is_empty()).then(|| format!("kernels the {runner} layers do not have yet: {}", lacks.join(", ")))
}

/// What went wrong in a segment: the backend's own error, kept whole.
#[derive(Debug, thiserror::Error)]
#[error("{backend}: {source}")]
pub struct OffloadError {
    /// "wgpu", "hip"
    pub backend: &'static str,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// A segment's activation buffers for steps of up to `max_tokens` tokens (one per run state,
/// made by [`LayerOffload::new_acts`]). Opaque to the engine.
pub struct OffloadActs(Box<dyn Any + Send>);

impl OffloadActs {
    pub(in crate::backend) fn new<T: Any + Send>(inner: T) -> OffloadActs {
        OffloadActs(Box::new(inner))
    }

    /// The backend's own activations; `None` for another backend's.
    pub(in crate::backend) fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.0.downcast_mut()
    }
}

/// What a backend keeps for one sequence's keys and values (behind [`OffloadKv`]).
pub(in crate::backend) trait DeviceKv: Any + Send {
    fn capacity(&self) -> usize;
    /// Device memory held.
    fn bytes(&self) -> u64;
    /// An empty cache of `capacity` positions for the same segment.
    fn empty_like(&self, capacity: usize) -> Result<OffloadKv, OffloadError>;
    /// Makes positions 0..n equal to those of `src` (a cache of the same segment), on the device.
    fn copy_prefix_from(&mut self, src: &OffloadKv, n: usize) -> Result<(), OffloadError>;
}

/// One sequence's keys and values for a segment's layers, on its device (made by
/// [`LayerOffload::new_kv`]). Opaque to the engine, which keeps the sequence's length.
pub struct OffloadKv(Box<dyn DeviceKv>);

impl OffloadKv {
    pub(in crate::backend) fn new<K: DeviceKv>(inner: K) -> OffloadKv {
        OffloadKv(Box::new(inner))
    }

    /// The backend's own cache; `None` for another backend's.
    pub(in crate::backend) fn get<K: DeviceKv>(&self) -> Option<&K> {
        (&*self.0 as &dyn Any).downcast_ref()
    }

    pub(in crate::backend) fn get_mut<K: DeviceKv>(&mut self) -> Option<&mut K> {
        (&mut *self.0 as &mut dyn Any).downcast_mut()
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    /// Device memory held, bytes.
    pub fn bytes(&self) -> u64 {
        self.0.bytes()
    }

    /// An empty cache of `capacity` positions for the same segment.
    pub fn empty_like(&self, capacity: usize) -> Result<OffloadKv, OffloadError> {
        self.0.empty_like(capacity)
    }

    /// Makes positions 0..n of this cache equal to those of `src` (another sequence's cache of
    /// the same segment, any capacity), copying on the device: the primitive behind prefix reuse.
    pub fn copy_prefix_from(&mut self, src: &OffloadKv, n: usize) -> Result<(), OffloadError> {
        self.0.copy_prefix_from(src, n)
    }
}

/// One sequence's part of a step: its cache for the segment and its tokens, which are `n_tok`
/// consecutive rows of the step at positions `start, start + 1, ...` (`start`: the sequence's
/// cached length).
pub struct SeqSpan<'a> {
    /// the sequence's cache for this segment
    pub kv: &'a mut OffloadKv,
    /// position of the span's first token (the sequence's cached length)
    pub start: usize,
    /// tokens of the sequence in this step
    pub n_tok: usize,
}

/// Logit rows a step asks a segment with the output head for.
pub struct LogitRows<'a> {
    /// Rows of the step (indices into its tokens), in the order wanted.
    pub rows: &'a [u32],
    /// [rows.len(), vocab]
    pub out: &'a mut [f32],
}

/// An accelerator running layers `[a, b)` of one model: the weights uploaded once when the
/// segment is made, the activations per run state and the KV per sequence behind handles.
///
/// Contract (every implementation): a token's outputs do not depend on the other tokens of the
/// step or on how its sequence was cut into steps (batch invariance), keys and values are stored
/// at the positions given, and nothing is read from `hidden` after the call returns.
pub trait LayerOffload: Send + Sync {
    /// The device, for start-up lines: e.g. "wgpu NVIDIA H100 (DiscreteGpu, Vulkan)".
    fn device(&self) -> String;

    /// The model layers this segment runs.
    fn layers(&self) -> Range<usize>;

    /// Whether it also runs the output norm and projection ([`LayerOffload::forward`] with
    /// `logits`); only a segment that ends the model can.
    fn has_head(&self) -> bool;

    /// Positions a KV cache of this segment may hold.
    fn max_positions(&self) -> usize;

    /// Weight bytes held on the device.
    fn weight_bytes(&self) -> u64;

    /// Activation buffers for steps of up to `max_tokens` tokens.
    fn new_acts(&self, max_tokens: usize) -> Result<OffloadActs, OffloadError>;

    /// An empty KV cache of `capacity` positions for one sequence.
    fn new_kv(&self, capacity: usize) -> Result<OffloadKv, OffloadError>;

    /// Runs the segment's layers over `hidden` ([n_tok, n_embd], replaced by their output) for
    /// the step's tokens at `positions` (the sequences' tokens in order; sequence s's are
    /// `s.start, s.start + 1, ...`); their keys and values go into each sequence's cache. With
    /// `logits` (needs [`has_head`](Self::has_head)) the output norm and projection run too,
    /// `hidden` is not written back, and the logits of the chosen rows land in `logits.out`.
    fn forward(
        &self,
        acts: &mut OffloadActs,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        logits: Option<LogitRows<'_>>,
    ) -> Result<(), OffloadError>;
}
