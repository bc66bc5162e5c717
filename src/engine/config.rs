//! Hyper-parameters from GGUF metadata (`{arch}.block_count`, ...): one config for every
//! architecture the engine runs, its architecture-specific parts optional.
//!
//! | `general.architecture` | what differs from Llama |
//! |------------------------|-------------------------|
//! | `llama`  | — (Llama 3's `rope_freqs.weight` frequency factors when present) |
//! | `qwen2`  | q/k/v biases, NeoX RoPE |
//! | `qwen3`  | per-head q/k RMSNorm, head size from `attention.key_length`, NeoX RoPE |
//! | `gemma3` | GeGLU, post-attention and post-FFN norms, q/k norms, embeddings × √n_embd, sliding-window layers (every `sliding_window_pattern`-th layer global) with their own RoPE base, NeoX RoPE |
//! | `phi3`   | fused q\|k\|v and gate\|up matrices, NeoX RoPE |

use crate::gguf::{GgufError, GgufFile, Value};

/// A model architecture this engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
}

impl Arch {
    pub const ALL: [Arch; 5] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Phi3];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// The two choices a layer runner on any backend needs too live at the offload seam.
pub use crate::backend::offload::{FfnActivation, RopeStyle};

/// Everything architecture-specific the forward pass reads, loaded from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Model architecture (`general.architecture`).
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream (embedding length).
    pub n_embd: usize,
    /// Width of the FFN's hidden layer.
    pub n_ff: usize,
    /// Number of query heads.
    pub n_head: usize,
    /// Number of key/value heads.
    pub n_head_kv: usize,
    /// Width of one head of Q, K and V (`attention.key_length`, else n_embd / n_head).
    pub head_dim: usize,
    /// Rotated dimensions of each head (`rope.dimension_count`, else head_dim).
    pub rope_dims: usize,
    /// How RoPE pairs the dimensions of a head.
    pub rope_style: RopeStyle,
    /// RoPE base of the global (full-attention) layers.
    pub rope_base: f32,
    /// Linear RoPE scaling of the global layers: positions × this (1 / `rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// RoPE base of the sliding-window layers (`rope.freq_base_swa`, else 10000).
    pub rope_base_swa: f32,
    /// Epsilon of the RMS norms.
    pub rms_eps: f32,
    /// Tokens in the vocabulary (rows of the output projection).
    pub vocab_size: usize,
    /// Context length the model was trained for (our maximum sequence length).
    pub n_ctx_train: usize,
    /// Output projection shares the token embedding matrix.
    pub tied_output: bool,
    /// Keys a sliding-window layer attends to (the query's own position and the ones before).
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends within `sliding_window` only (else globally).
    pub swa_layers: Vec<bool>,
    /// Token embeddings are multiplied by this (Gemma: √n_embd).
    pub embed_scale: Option<f32>,
    /// Query scale in attention (1/√head_dim but for Gemma 3 27B).
    pub attn_scale: f32,
    /// Activation of the FFN gate (SiLU, or GELU tanh for Gemma 3).
    pub ffn_activation: FfnActivation,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before the residual add (Gemma).
    pub post_norms: bool,
    /// Biases on Q, K and V (Qwen2).
    pub qkv_bias: bool,
    /// Q, K, V in one matrix and gate, up in one (Phi-3).
    pub fused: bool,
    /// logits = c · tanh(logits / c) (`final_logit_softcapping`).
    pub final_softcap: Option<f32>,
}

/// The name code written before the rename; kept so code of other tiers reads the same.
pub type LlamaConfig = ModelConfig;

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<ModelConfig, GgufError> {
        let arch_name = g.str("general.architecture")?;
        let arch = Arch::from_name(arch_name).ok_or_else(|| GgufError::UnsupportedArch {
            arch: arch_name.to_string(),
            supported: Arch::ALL.map(Arch::name).join(", "),
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let has = |k: &str| g.get(&key(k)).is_some();
        let n = |k: &str| -> Result<usize, GgufError> {
            let v = g.u64(&key(k))?;
            usize::try_from(v).ok().filter(|&v| v > 0 && v < 1 << 24).ok_or_else(|| {
                GgufError::Corrupt(format!("{}: value {v} out of range", key(k)))
            })
        };
        let float = |k: &str, default: f32| -> Result<f32, GgufError> { if has(k) { g.f32(&key(k)) } else { Ok(default) } };
        let n_embd = n("embedding_length")?;
        let n_head = n("attention.head_count")?;
        let n_head_kv = if has("attention.head_count_kv") { n("attention.head_count_kv")? } else { n_head };
        if n_head % n_head_kv != 0 {
            return Err(GgufError::Corrupt(format!("{n_head} heads do not split into {n_head_kv} KV heads")));
        }
        let head_dim = if has("attention.key_length") {
            n("attention.key_length")?
        } else if n_embd % n_head == 0 {
            n_embd / n_head
        } else {
            return Err(GgufError::Corrupt(format!("n_embd {n_embd} does not split into {n_head} heads")));
        };
        if has("attention.value_length") && n("attention.value_length")? != head_dim {
            return Err(GgufError::Corrupt(format!("value head size {} differs from key head size {head_dim} (not supported)", n("attention.value_length")?)));
        }
        let rope_dims = if has("rope.dimension_count") { n("rope.dimension_count")? } else { head_dim };
        if rope_dims > head_dim || rope_dims % 2 != 0 || head_dim % 2 != 0 {
            return Err(GgufError::Corrupt(format!("rope dimension {rope_dims} invalid for head size {head_dim}")));
        }
        let vocab_size = if has("vocab_size") { n("vocab_size")? } else { g.array("tokenizer.ggml.tokens")?.len() };
        let rope_base = float("rope.freq_base", 10000.0)?;
        let rms_eps = g.f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_freq_scale = match g.get(&key("rope.scaling.type")) {
            None => 1.0,
            Some(Value::String(t)) if t == "none" || t == "linear" => {
                let f = if has("rope.scaling.factor") { g.f32(&key("rope.scaling.factor"))? } else { float("rope.scale_linear", 0.0)? };
                if f == 0.0 { 1.0 } else { 1.0 / f }
            }
            Some(Value::String(t)) => return Err(GgufError::Unsupported(format!("{}: rope scaling {t:?} (supported: none, linear)", key("rope.scaling.type")))),
            Some(v) => return Err(GgufError::WrongType { key: key("rope.scaling.type"), found: v.type_name(), expected: "string" }),
        };
        let rope_base_swa = float("rope.freq_base_swa", 10000.0)?;
        for (what, v) in [("rope base", rope_base), ("rope base (sliding window)", rope_base_swa), ("rope scale", rope_freq_scale)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(GgufError::Corrupt(format!("{what} {v} invalid")));
            }
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(GgufError::Corrupt(format!("rms eps {rms_eps} invalid")));
        }
        let n_layer = n("block_count")?;
        // llama.cpp turns Phi-3's window off (its converted metadata is unreliable); elsewhere the
        // file's window applies, to every layer or per Gemma's pattern.
        let sliding_window = if has("attention.sliding_window") && arch != Arch::Phi3 { Some(n("attention.sliding_window")?) } else { None };
        let swa_layers = match sliding_window {
            None => vec![false; n_layer],
            Some(_) => swa_pattern(g, &key("attention.sliding_window_pattern"), arch, n_layer)?,
        };
        let softcap = float("final_logit_softcapping", 0.0)?;
        let is = |a: &[Arch]| a.contains(&arch);
        Ok(ModelConfig {
            arch,
            n_layer,
            n_embd,
            n_ff: n("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            rope_dims,
            rope_style: if arch == Arch::Llama { RopeStyle::Adjacent } else { RopeStyle::Neox },
            rope_base,
            rope_freq_scale,
            rope_base_swa,
            rms_eps,
            vocab_size,
            n_ctx_train: n("context_length")?,
            tied_output: g.tensor_info("output.weight").is_err(),
            sliding_window,
            swa_layers,
            embed_scale: (arch == Arch::Gemma3).then(|| (n_embd as f32).sqrt()),
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            ffn_activation: if arch == Arch::Gemma3 { FfnActivation::GeluTanh } else { FfnActivation::Silu },
            qk_norm: is(&[Arch::Qwen3, Arch::Gemma3]),
            post_norms: arch == Arch::Gemma3,
            qkv_bias: arch == Arch::Qwen2,
            fused: arch == Arch::Phi3,
            final_softcap: (softcap > 0.0).then_some(softcap),
        })
    }

    /// Width of the K (and V) projection: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the Q projection and of the attention output: n_head * head_dim.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The sliding window of layer `l`, if it has one.
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.swa_layers.get(l).copied().unwrap_or(false))
    }
}

/// Which layers use the sliding window: `key` as an array of bools (one per layer), or a period
/// n (every n-th layer global, the others windowed; 0 = all windowed), else the architecture's
/// default period (Gemma 3: 6) or every layer.
fn swa_pattern(g: &GgufFile, key: &str, arch: Arch, n_layer: usize) -> Result<Vec<bool>, GgufError> {
    let period = match g.get(key) {
        Some(Value::Array(a)) => {
            let flags: Option<Vec<bool>> = a.iter().map(|v| if let Value::Bool(b) = v { Some(*b) } else { v.as_u64().map(|x| x != 0) }).collect();
            return match flags {
                Some(f) if f.len() == n_layer => Ok(f),
                _ => Err(GgufError::Corrupt(format!("{key}: expected {n_layer} booleans"))),
            };
        }
        Some(v) => v.as_u64().ok_or_else(|| GgufError::WrongType { key: key.into(), found: v.type_name(), expected: "unsigned integer or array" })? as usize,
        None if arch == Arch::Gemma3 => 6,
        None => 0,
    };
    Ok((0..n_layer).map(|l| period == 0 || l % period < period - 1).collect())
}
