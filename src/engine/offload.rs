//! The engine's side of the layer-offload seam (`backend::offload`): the model's tensors as a
//! backend reads them ([`ModelTensors`] for [`Model`]), and the list of offloaded segments a
//! model keeps ([`Model::offload`]). `Model::forward` runs each segment where its layers begin and
//! the backend runs every other layer; a run state keeps one activation handle per segment and a
//! KV cache one KV handle per segment, both made on first use.

use std::ops::Range;

use super::config::LlamaConfig;
use super::model::{Model, ModelError};
use crate::backend::offload::{HeadTensors, LayerOffload, LayerShape, LayerTensors, ModelTensors};

impl From<&LlamaConfig> for LayerShape {
    fn from(c: &LlamaConfig) -> LayerShape {
        LayerShape {
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            rope_dims: c.rope_dims,
            rope_base: c.rope_base,
            rms_eps: c.rms_eps,
            vocab_size: c.vocab_size,
            n_ctx_train: c.n_ctx_train,
            rope_style: c.rope_style,
            rope_freq_scale: c.rope_freq_scale,
            rope_base_swa: c.rope_base_swa,
            sliding_window: c.sliding_window,
            swa_layers: c.swa_layers.clone(),
            attn_scale: c.attn_scale,
            ffn_activation: c.ffn_activation,
            final_softcap: c.final_softcap,
        }
    }
}

impl ModelTensors for Model {
    fn shape(&self) -> LayerShape {
        LayerShape::from(&self.config)
    }

    fn layer(&self, li: usize) -> LayerTensors<'_> {
        let (l, g) = (&self.weights.layers[li], &self.gguf);
        LayerTensors {
            attn_norm: &l.attn_norm,
            wq: l.wq.view(g),
            wk: l.wk.view(g),
            wv: l.wv.view(g),
            wo: l.wo.view(g),
            ffn_norm: &l.ffn_norm,
            w_gate: l.w_gate.view(g),
            w_up: l.w_up.view(g),
            w_down: l.w_down.view(g),
            bq: l.bq.as_deref(),
            bk: l.bk.as_deref(),
            bv: l.bv.as_deref(),
            q_norm: l.q_norm.as_deref(),
            k_norm: l.k_norm.as_deref(),
            post_attn_norm: l.post_attn_norm.as_deref(),
            post_ffn_norm: l.post_ffn_norm.as_deref(),
        }
    }

    fn head(&self) -> HeadTensors<'_> {
        HeadTensors { norm: &self.weights.output_norm, output: self.weights.output.view(&self.gguf) }
    }

    fn rope_freqs(&self) -> Option<&[f32]> {
        self.weights.rope_freqs.as_deref()
    }
}

impl Model {
    /// Hands runs of layers to accelerators: each segment (built from this model, its weights
    /// already on its device) runs its layers, and each sequence's KV for them lives there; the
    /// backend runs the other layers, the embedding and, unless the last segment has the output
    /// head, the output norm and logits. Segments may come in any order and must not overlap.
    /// Call before making run states or KV caches; an empty list undoes it.
    pub fn offload(&mut self, mut segments: Vec<Box<dyn LayerOffload>>) -> Result<(), ModelError> {
        segments.sort_by_key(|s| s.layers().start);
        let n_layer = self.config.n_layer;
        let mut end = 0;
        for s in &segments {
            let r = s.layers();
            let bad = |why: &str| ModelError::BadOffload(format!("{} layers {}..{} of {n_layer}: {why}", s.device(), r.start, r.end));
            if r.is_empty() || r.end > n_layer {
                return Err(bad("not a run of the model's layers"));
            }
            if r.start < end {
                return Err(bad("overlaps another segment"));
            }
            if s.has_head() && r.end != n_layer {
                return Err(bad("an output head on a segment that does not end the model"));
            }
            end = r.end;
        }
        self.segments = segments;
        Ok(())
    }

    /// Runs every layer on the backend again (drops the segments).
    pub fn offload_none(&mut self) {
        self.segments.clear();
    }

    /// The offloaded segments, in layer order.
    pub fn segments(&self) -> &[Box<dyn LayerOffload>] {
        &self.segments
    }

    /// The offloaded layers when the segments form one contiguous run (`None` without segments
    /// or with backend layers between two of them).
    pub fn gpu_layers(&self) -> Option<Range<usize>> {
        let (first, last) = (self.segments.first()?, self.segments.last()?);
        let contiguous = self.segments.windows(2).all(|w| w[0].layers().end == w[1].layers().start);
        contiguous.then(|| first.layers().start..last.layers().end)
    }

    /// The segment that runs layer `li`, if any.
    pub(super) fn segment_of(&self, li: usize) -> Option<usize> {
        self.segments.iter().position(|s| s.layers().contains(&li))
    }

    /// Whether some layer runs on the host backend (the only reader of the run state's RoPE rows:
    /// an offloaded layer ropes on its device).
    pub(super) fn host_layers(&self) -> bool {
        (0..self.config.n_layer).any(|li| self.segment_of(li).is_none())
    }

    /// Whether the output norm and logits run on the last segment's device (its layers end the
    /// model and it has the head).
    pub(super) fn offload_logits(&self) -> bool {
        self.segments.last().is_some_and(|s| s.has_head())
    }

    /// Where the layers run, e.g. "cpu-avx2 (16 threads)" or
    /// "cpu-avx2 (16 threads): 10 layers + wgpu NVIDIA H100 (DiscreteGpu, Vulkan): layers 10..30, logits on the GPU".
    pub fn placement(&self) -> String {
        if self.segments.is_empty() {
            return self.backend().name();
        }
        let parts: Vec<String> = self.segments.iter().map(|s| format!("{}: layers {}..{}", s.device(), s.layers().start, s.layers().end)).collect();
        let devices = parts.join(" + ");
        let cpu_layers = self.config.n_layer - self.segments.iter().map(|s| s.layers().len()).sum::<usize>();
        let logits = if self.offload_logits() { "logits on the GPU" } else { "logits on the CPU" };
        if cpu_layers == 0 {
            return format!("{devices}, {logits}; embedding on {}", self.backend().name());
        }
        format!("{}: {cpu_layers} layers + {devices}, {logits}", self.backend().name())
    }
}
