//! The forward pass of every architecture ([`ModelConfig`]): token embedding, `n_layer` ×
//! (RMSNorm, grouped-query attention with RoPE, RMSNorm, gated FFN), final norm, output
//! projection; the architectures' optional parts (biases, q/k norms, post-norms, sliding
//! windows, GeGLU, embedding scale) are steps of the one layer function, taken when the config
//! has them. Weights are views into the GGUF map ([`Weights`]); activations live in a
//! preallocated [`RunState`]; each sequence has its own [`KvCache`]. One call can carry tokens of
//! several sequences (continuous batching): matmuls run over all of them at once, attention per
//! sequence.

use std::path::Path;
use std::sync::Arc;

use crate::backend::cpu::ops;
use crate::backend::offload::{LayerOffload, LogitRows, OffloadActs, OffloadError, SeqSpan};
use crate::backend::{AttentionArgs, Backend, WeightView};
use crate::gguf::{GgufError, GgufFile};

use super::config::{ModelConfig, RopeStyle};
use super::kv::KvCache;
use super::weights::Weights;

pub struct Model {
    /// Hyper-parameters from the GGUF metadata.
    pub config: ModelConfig,
    /// The opened GGUF file (metadata and the mapped tensor data).
    pub gguf: GgufFile,
    /// Views of the weight tensors in `gguf`.
    pub weights: Weights,
    backend: Arc<dyn Backend>,
    /// Runs of layers on accelerators, in layer order (see [`Model::offload`], engine/offload.rs);
    /// the backend runs the others.
    pub(super) segments: Vec<Box<dyn LayerOffload>>,
}

/// The activations a residual projection reads (a field of [`RunState`]).
#[derive(Clone, Copy)]
enum Acts {
    /// `att`: the attention output (wo)
    Att,
    /// `gate`: act(gate)·up (the down projection)
    Gate,
}

/// Which logits a sequence wants from a forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    /// Only after the last token (generation).
    Last,
    /// After every token (scoring).
    All,
    /// After tokens `k..` of this call (draft verification: the last prompt token onwards).
    From(usize),
}

impl Logits {
    /// The rows of a call with `m` tokens that want logits.
    pub fn rows(self, m: usize) -> std::ops::Range<usize> {
        match self {
            Logits::None => 0..0,
            Logits::Last => m.saturating_sub(1)..m,
            Logits::All => 0..m,
            Logits::From(k) => k.min(m)..m,
        }
    }
}

/// New tokens of one sequence for a forward call; they take positions `kv.len()..`.
pub struct SeqBatch<'a> {
    /// The sequence's cache; the new tokens are appended to it.
    pub kv: &'a mut KvCache,
    /// Token ids to feed.
    pub tokens: &'a [u32],
    /// Which of the new tokens' logits to compute.
    pub logits: Logits,
}

/// Activation buffers for up to `max_tokens` tokens per call, allocated once.
pub struct RunState {
    /// Most tokens one forward call can take (sum over its sequences).
    pub max_tokens: usize,
    /// [max_tokens, n_embd] residual stream
    x: Vec<f32>,
    /// [max_tokens, n_embd] normalized input of the current block
    xn: Vec<f32>,
    /// [max_tokens, n_head * head_dim]
    q: Vec<f32>,
    /// [max_tokens, n_head_kv * head_dim]
    k: Vec<f32>,
    /// [max_tokens, n_head_kv * head_dim]
    v: Vec<f32>,
    /// [max_tokens, n_head * head_dim] attention output
    att: Vec<f32>,
    /// [max_tokens, n_embd] block output before the residual add
    proj: Vec<f32>,
    /// [max_tokens, n_ff]
    gate: Vec<f32>,
    /// [max_tokens, n_ff]
    up: Vec<f32>,
    /// [max_tokens] position of each token
    pos: Vec<u32>,
    /// [max_tokens] step rows that want logits (GPU output head)
    rows: Vec<u32>,
    /// [max_tokens, head_dim / 2, 2] RoPE (cos, sin) of each token of the call, global layers
    rope: Vec<f32>,
    /// [max_tokens, head_dim / 2, 2] the same for sliding-window layers (empty: none)
    rope_swa: Vec<f32>,
    /// [max_tokens] 0, 1, 2, ...: the row of each token in `rope` / `rope_swa`
    tok_rows: Vec<u32>,
    /// [rows, vocab] logits of the rows that asked for them, in batch order (grown to the most
    /// rows asked for so far, so a decode loop allocates nothing once warm)
    pub logits: Vec<f32>,
    /// Number of valid rows in `logits` after the last call.
    pub n_logits: usize,
    /// Per offloaded segment of the model (same order): its activations, made on the first
    /// forward call that runs it.
    offload: Vec<Option<OffloadActs>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("batch of {got} tokens exceeds the run state's {max}")]
    BatchTooLarge { got: usize, max: usize },
    #[error("sequence would reach position {needed}, KV capacity is {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("token id {id} outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("weight type {ty} is not supported by backend {backend}")]
    Unsupported { ty: &'static str, backend: String },
    #[error("offloaded layers: {0}")]
    Offload(#[from] OffloadError),
    #[error("cannot offload {0}")]
    BadOffload(String),
}

impl Model {
    /// Loads a GGUF model: parses metadata, locates and checks every tensor, then gives the
    /// backend its own copies of the matrices ([`Model::prepare_weights`]).
    pub fn load(path: impl AsRef<Path>, backend: Arc<dyn Backend>) -> Result<Model, ModelError> {
        let model = Model::load_unprepared(path, backend)?;
        model.prepare_weights();
        Ok(model)
    }

    /// As [`Model::load`] without the backend's copies (no tensor data read): the service maps
    /// the model at start-up and its engine thread prepares the weights before its first step
    /// (SmolLM2's repack is ~70 ms, the 1.1B's ~400 ms: an EXACT hit does not wait for it).
    pub fn load_unprepared(path: impl AsRef<Path>, backend: Arc<dyn Backend>) -> Result<Model, ModelError> {
        let gguf = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&gguf)?;
        let weights = Weights::load(&gguf, &config)?;
        for l in &weights.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                if !backend.supports(crate::backend::Op::MatMul, m.ty()) {
                    return Err(ModelError::Unsupported { ty: m.ty().name(), backend: backend.name() });
                }
            }
        }
        Ok(Model { config, gguf, weights, backend, segments: Vec::new() })
    }

    /// Gives the backend its own layout of the matrices it runs (the layers no accelerator
    /// segment holds, and the output projection); returns the bytes of the new copies. Called
    /// once before the first forward call that should use them (a matrix keeps the copy it got
    /// first, so calling it again changes nothing).
    pub fn prepare_weights(&self) -> usize {
        let t = std::time::Instant::now();
        let offloaded = |i: usize| self.segments.iter().any(|s| s.layers().contains(&i));
        let bytes = self.weights.prepare(&self.gguf, &*self.backend, |i| !offloaded(i));
        if bytes > 0 {
            tracing::debug!(bytes, ms = t.elapsed().as_secs_f64() * 1e3, "weights repacked for the backend's kernels");
        }
        bytes
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn new_state(&self, max_tokens: usize) -> RunState {
        let c = &self.config;
        let max_tokens = max_tokens.max(1);
        let z = |n: usize| vec![0f32; max_tokens * n];
        let swa = self.swa_rope();
        RunState {
            max_tokens,
            x: z(c.n_embd),
            xn: z(c.n_embd),
            q: z(c.q_dim()),
            k: z(c.kv_dim()),
            v: z(c.kv_dim()),
            att: z(c.q_dim()),
            proj: z(c.n_embd),
            gate: z(c.n_ff),
            up: z(c.n_ff),
            pos: vec![0; max_tokens],
            rows: Vec::with_capacity(max_tokens),
            rope: z(c.head_dim),
            rope_swa: if swa { z(c.head_dim) } else { Vec::new() },
            tok_rows: (0..max_tokens as u32).collect(),
            logits: Vec::new(),
            n_logits: 0,
            offload: Vec::new(),
        }
    }

    /// A KV cache for a sequence of up to `capacity` tokens (clamped to the trained context).
    /// Its parts for offloaded layers are allocated on the sequence's first forward call.
    pub fn new_kv(&self, capacity: usize) -> KvCache {
        KvCache::with_cpu_layers(&self.config, capacity.min(self.config.n_ctx_train), |l| self.segment_of(l).is_none())
    }

    /// Allocates the offloaded parts of `kv` now (otherwise its first forward call does).
    pub fn prepare_kv(&self, kv: &mut KvCache) -> Result<(), ModelError> {
        for i in 0..self.segments.len() {
            self.segment_kv(i, kv)?;
        }
        Ok(())
    }

    /// Makes segment `i`'s part of `kv` unless it exists.
    fn segment_kv(&self, i: usize, kv: &mut KvCache) -> Result<(), ModelError> {
        if kv.offload.len() < self.segments.len() {
            kv.offload.resize_with(self.segments.len(), || None);
        }
        if kv.offload[i].is_none() {
            kv.offload[i] = Some(self.segments[i].new_kv(kv.capacity)?);
        }
        Ok(())
    }

    /// Runs the new tokens of every sequence through the model, appends their keys and values to
    /// each sequence's cache, and leaves the requested logits in `state.logits` (rows in batch
    /// order). The total number of tokens must fit the run state.
    pub fn forward(&self, state: &mut RunState, seqs: &mut [SeqBatch<'_>]) -> Result<(), ModelError> {
        let c = &self.config;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n > state.max_tokens {
            return Err(ModelError::BatchTooLarge { got: n, max: state.max_tokens });
        }
        for s in seqs.iter() {
            let needed = s.kv.len() + s.tokens.len();
            if needed > s.kv.capacity {
                return Err(ModelError::ContextFull { needed, capacity: s.kv.capacity });
            }
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ModelError::BadToken { id, vocab: c.vocab_size });
            }
        }
        let b = &*self.backend;
        let g = &self.gguf;
        let e = c.n_embd;

        // Token embeddings (scaled where the architecture says so) and positions.
        let mut t = 0;
        for s in seqs.iter() {
            self.embed(state, t, s.tokens);
            for i in 0..s.tokens.len() {
                state.pos[t + i] = (s.kv.len() + i) as u32;
            }
            t += s.tokens.len();
        }
        // RoPE rows serve the host's layers only (512 rows cost a few tenths of a ms of sin / cos)
        if self.host_layers() {
            self.fill_rope(state, n);
        }
        let offload_logits = self.offload_logits();
        let n_rows: usize = seqs.iter().map(|s| s.logits.rows(s.tokens.len()).len()).sum();
        if state.logits.len() < n_rows * c.vocab_size {
            state.logits.resize(n_rows * c.vocab_size, 0.0);
        }
        if offload_logits {
            // The rows that want logits, in batch order (as the CPU path below).
            state.rows.clear();
            let mut t0 = 0;
            for s in seqs.iter() {
                let m = s.tokens.len();
                let wanted = s.logits.rows(m);
                state.rows.extend(wanted.map(|i| (t0 + i) as u32));
                t0 += m;
            }
        }
        for li in 0..c.n_layer {
            if let Some(i) = self.segment_of(li) {
                if li == self.segments[i].layers().start {
                    let logits = offload_logits && i + 1 == self.segments.len();
                    self.segment_forward(i, state, seqs, n, logits)?;
                }
                continue;
            }
            self.cpu_layer(li, state, seqs, n);
        }
        for s in seqs.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        if offload_logits {
            state.n_logits = state.rows.len();
            return Ok(());
        }

        // Gather the rows that want logits, normalize them, project to the vocabulary.
        let mut rows = 0;
        let mut t0 = 0;
        for s in seqs.iter() {
            let m = s.tokens.len();
            let wanted = s.logits.rows(m);
            for i in wanted {
                let src = (t0 + i) * e;
                let (x, xn) = (&state.x[src..src + e], &mut state.xn[rows * e..(rows + 1) * e]);
                b.rmsnorm(x, &self.weights.output_norm, c.rms_eps, xn);
                rows += 1;
            }
            t0 += m;
        }
        state.n_logits = rows;
        if rows > 0 {
            let v = c.vocab_size;
            let logits = &mut state.logits[..rows * v];
            b.matmul(self.weights.output.view(g), &state.xn[..rows * e], rows, logits);
            if let Some(cap) = c.final_softcap {
                logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
        }
        Ok(())
    }

    /// RoPE (cos, sin) rows of the call's `n` tokens (`state.pos`): one row per token, for the
    /// global layers and, when they differ, the sliding-window layers. Each row depends only on
    /// its position (GGML's arithmetic: θ_i = pos · base^(-2i/rope_dims) by repeated
    /// multiplication in f32, divided by the frequency factor, times the linear scale).
    pub(super) fn fill_rope(&self, state: &mut RunState, n: usize) {
        let c = &self.config;
        let hd = c.head_dim;
        let factors = self.weights.rope_freqs.as_deref();
        for (t, &pos) in state.pos[..n].iter().enumerate() {
            let row = &mut state.rope[t * hd..(t + 1) * hd];
            ops::rope_row(pos, c.rope_dims, c.rope_base, c.rope_freq_scale, factors, row);
            if !state.rope_swa.is_empty() {
                let row = &mut state.rope_swa[t * hd..(t + 1) * hd];
                ops::rope_row(pos, c.rope_dims, c.rope_base_swa, 1.0, None, row);
            }
        }
    }

    /// The embeddings of `tokens` (ids checked by the caller) in rows `t0..` of the residual
    /// stream, scaled where the architecture says so: dequantized by the backend (the CPU's team
    /// splits the rows), the same values as a row-by-row loop.
    fn embed(&self, state: &mut RunState, t0: usize, tokens: &[u32]) {
        let e = self.config.n_embd;
        let x = &mut state.x[t0 * e..(t0 + tokens.len()) * e];
        self.backend.dequantize_rows(self.weights.token_embd.view(&self.gguf), tokens, x);
        if let Some(scale) = self.config.embed_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
    }

    /// BLEND's start: the embeddings of `tokens` in rows 0.. of the residual stream at positions
    /// 0.. (the whole prompt, one sequence), with their RoPE rows.
    pub(super) fn embed_all(&self, state: &mut RunState, tokens: &[u32]) -> Result<(), ModelError> {
        let c = &self.config;
        if tokens.len() > state.max_tokens {
            return Err(ModelError::BatchTooLarge { got: tokens.len(), max: state.max_tokens });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::BadToken { id, vocab: c.vocab_size });
        }
        self.embed(state, 0, tokens);
        for (t, p) in state.pos[..tokens.len()].iter_mut().enumerate() {
            *p = t as u32;
        }
        self.fill_rope(state, tokens.len());
        Ok(())
    }

    /// BLEND's selective recompute: keeps the residual rows of positions `rows` (ascending; row
    /// `p - first` holds position `p`, as [`Model::embed_all`] wrote them with `first` = 0) as
    /// rows 0.. at their positions, with their RoPE rows.
    pub(super) fn keep_rows(&self, state: &mut RunState, rows: &[u32], first: usize) {
        let e = self.config.n_embd;
        for (j, &p) in rows.iter().enumerate() {
            let src = p as usize - first;
            debug_assert!(src >= j);
            if src != j {
                state.x.copy_within(src * e..(src + 1) * e, j * e);
            }
            state.pos[j] = p;
        }
        self.fill_rope(state, rows.len());
    }

    /// Whether sliding-window layers rotate with their own RoPE rows (base, scale or factors
    /// differ from the global layers').
    pub(super) fn swa_rope(&self) -> bool {
        let c = &self.config;
        c.sliding_window.is_some() && (c.rope_base_swa != c.rope_base || c.rope_freq_scale != 1.0 || self.weights.rope_freqs.is_some())
    }

    /// Whether any layers run on another tier (their KV lives there).
    pub(super) fn has_offload(&self) -> bool {
        !self.segments.is_empty()
    }

    /// Layer `li` alone on the backend over `state`'s residual stream as it is (calibration):
    /// positions from each cache's length; the caches advance.
    pub(crate) fn layer_forward(&self, li: usize, state: &mut RunState, seqs: &mut [SeqBatch<'_>]) -> Result<(), ModelError> {
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if n > state.max_tokens {
            return Err(ModelError::BatchTooLarge { got: n, max: state.max_tokens });
        }
        let mut t = 0;
        for s in seqs.iter() {
            if !s.kv.on_host(li) || s.kv.len() + s.tokens.len() > s.kv.capacity {
                return Err(ModelError::ContextFull { needed: s.kv.len() + s.tokens.len(), capacity: s.kv.capacity });
            }
            for i in 0..s.tokens.len() {
                state.pos[t] = (s.kv.len() + i) as u32;
                t += 1;
            }
        }
        self.fill_rope(state, n);
        self.cpu_layer(li, state, seqs, n);
        for s in seqs.iter_mut() {
            s.kv.advance(s.tokens.len());
        }
        Ok(())
    }

    /// Layer `li` on the backend for the `n` tokens of `seqs` (KV in the host part of each cache):
    /// the attention block, then the feed-forward block, each added to the residual stream.
    pub(super) fn cpu_layer(&self, li: usize, state: &mut RunState, seqs: &mut [SeqBatch<'_>], n: usize) {
        let c = &self.config;
        let b = &*self.backend;
        let g = &self.gguf;
        let (e, hd, qd, kvd, ff) = (c.n_embd, c.head_dim, c.q_dim(), c.kv_dim(), c.n_ff);
        let lw = &self.weights.layers[li];

        // Attention: norm, q|k|v (+ biases), per-head q/k norms, RoPE.
        b.rmsnorm(&state.x[..n * e], &lw.attn_norm, c.rms_eps, &mut state.xn[..n * e]);
        b.matmul_multi(
            &[lw.wq.view(g), lw.wk.view(g), lw.wv.view(g)],
            &state.xn[..n * e],
            n,
            &mut [&mut state.q[..n * qd], &mut state.k[..n * kvd], &mut state.v[..n * kvd]],
        );
        for (bias, x, w) in [(&lw.bq, &mut state.q, qd), (&lw.bk, &mut state.k, kvd), (&lw.bv, &mut state.v, kvd)] {
            if let Some(bias) = bias {
                x[..n * w].chunks_exact_mut(w).for_each(|row| b.add(row, bias));
            }
        }
        if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
            // Per head (weights of head_dim); `att` is free until attention writes it.
            b.rmsnorm(&state.q[..n * qd], qn, c.rms_eps, &mut state.att[..n * qd]);
            std::mem::swap(&mut state.q, &mut state.att);
            b.rmsnorm(&state.k[..n * kvd], kn, c.rms_eps, &mut state.att[..n * kvd]);
            state.k[..n * kvd].copy_from_slice(&state.att[..n * kvd]);
        }
        let window = c.window(li);
        let cos_sin = if window.is_some() && !state.rope_swa.is_empty() { &state.rope_swa } else { &state.rope };
        let rows = &state.tok_rows[..n];
        match c.rope_style {
            RopeStyle::Adjacent => {
                b.rope(&mut state.q[..n * qd], rows, c.n_head, hd, cos_sin);
                b.rope(&mut state.k[..n * kvd], rows, c.n_head_kv, hd, cos_sin);
            }
            RopeStyle::Neox => {
                b.rope_neox(&mut state.q[..n * qd], rows, c.n_head, hd, c.rope_dims, cos_sin);
                b.rope_neox(&mut state.k[..n * kvd], rows, c.n_head_kv, hd, c.rope_dims, cos_sin);
            }
        }
        // The attention kernels scale scores by 1/√head_dim; another query scale goes into q.
        let q_scale = c.attn_scale * (hd as f32).sqrt();
        if q_scale != 1.0 {
            state.q[..n * qd].iter_mut().for_each(|v| *v *= q_scale);
        }

        let pos = &state.pos[..n];
        let mut t0 = 0;
        for s in seqs.iter_mut() {
            let m = s.tokens.len();
            // At each token's position (`kv.len()..` for a forward call; scattered for BLEND).
            s.kv.store_at(li, &pos[t0..t0 + m], &state.k[t0 * kvd..(t0 + m) * kvd], &state.v[t0 * kvd..(t0 + m) * kvd]);
            let (kc, vc) = s.kv.layer(li);
            b.attention(AttentionArgs {
                q: &state.q[t0 * qd..(t0 + m) * qd],
                k_cache: kc,
                v_cache: vc,
                capacity: s.kv.capacity,
                positions: &pos[t0..t0 + m],
                n_head: c.n_head,
                n_kv_head: c.n_head_kv,
                head_dim: hd,
                window,
                out: &mut state.att[t0 * qd..(t0 + m) * qd],
            });
            t0 += m;
        }
        self.residual_proj(state, lw.wo.view(g), Acts::Att, n, lw.post_attn_norm.as_deref());

        // Feed-forward: norm, act(gate)·up (one backend call: it may fuse them), down.
        b.rmsnorm(&state.x[..n * e], &lw.ffn_norm, c.rms_eps, &mut state.xn[..n * e]);
        b.matmul_gated(lw.w_gate.view(g), lw.w_up.view(g), &state.xn[..n * e], n, c.ffn_activation, &mut state.gate[..n * ff], &mut state.up[..n * ff]);
        self.residual_proj(state, lw.w_down.view(g), Acts::Gate, n, lw.post_ffn_norm.as_deref());
    }

    /// x += w · acts, or x += rmsnorm(w · acts) with `post_norm` (Gemma's post-attention /
    /// post-FFN norms); without one the backend may add each row as it computes it.
    fn residual_proj(&self, state: &mut RunState, w: WeightView<'_>, acts: Acts, n: usize, post_norm: Option<&[f32]>) {
        let (b, e) = (&*self.backend, self.config.n_embd);
        let a = match acts {
            Acts::Att => &state.att[..n * w.cols],
            Acts::Gate => &state.gate[..n * w.cols],
        };
        match post_norm {
            Some(nw) => {
                b.matmul(w, a, n, &mut state.proj[..n * e]);
                b.rmsnorm(&state.proj[..n * e], nw, self.config.rms_eps, &mut state.xn[..n * e]);
                b.add(&mut state.x[..n * e], &state.xn[..n * e]);
            }
            None => b.matmul_add(w, a, n, &mut state.proj[..n * e], &mut state.x[..n * e]),
        }
    }

    /// Segment `i`'s layers for the `n` tokens of `seqs`: the residual stream goes to its
    /// device and comes back. With `logits`, the segment's output head writes the logits of
    /// `state.rows` instead.
    fn segment_forward(&self, i: usize, state: &mut RunState, seqs: &mut [SeqBatch<'_>], n: usize, logits: bool) -> Result<(), ModelError> {
        let seg = &self.segments[i];
        if state.offload.len() < self.segments.len() {
            state.offload.resize_with(self.segments.len(), || None);
        }
        if state.offload[i].is_none() {
            state.offload[i] = Some(seg.new_acts(state.max_tokens)?);
        }
        for s in seqs.iter_mut() {
            self.segment_kv(i, s.kv)?;
        }
        // One small vector per call (the spans borrow the caches); buffers and bind groups are reused.
        let mut spans: Vec<SeqSpan<'_>> = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let (start, n_tok) = (s.kv.len(), s.tokens.len());
            if let Some(kv) = s.kv.offload[i].as_mut() {
                spans.push(SeqSpan { kv, start, n_tok });
            }
        }
        let e = self.config.n_embd;
        let Some(acts) = state.offload[i].as_mut() else { return Err(ModelError::BadOffload("a segment without activations".into())) };
        let k = state.rows.len() * self.config.vocab_size;
        let logits = logits.then(|| LogitRows { rows: &state.rows, out: &mut state.logits[..k] });
        seg.forward(acts, &mut state.x[..n * e], &state.pos[..n], &mut spans, logits)?;
        Ok(())
    }

    /// Logits row `i` of the last forward call.
    pub fn logits<'s>(&self, state: &'s RunState, i: usize) -> &'s [f32] {
        let v = self.config.vocab_size;
        &state.logits[i * v..(i + 1) * v]
    }
}
