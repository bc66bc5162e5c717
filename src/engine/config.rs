//! Llama-family hyper-parameters read from GGUF metadata (`{arch}.block_count`, ...).

use crate::gguf::{GgufError, GgufFile};

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    pub vocab_size: usize,
    /// Context length the model was trained for (our maximum sequence length).
    pub n_ctx_train: usize,
    /// Output projection shares the token embedding matrix.
    pub tied_output: bool,
}

impl LlamaConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<LlamaConfig, GgufError> {
        let arch = g.str("general.architecture")?.to_string();
        if arch != "llama" {
            return Err(GgufError::Corrupt(format!("architecture {arch:?} is not supported (supported: llama)")));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let n = |k: &str| -> Result<usize, GgufError> {
            let v = g.u64(&key(k))?;
            usize::try_from(v).ok().filter(|&v| v > 0 && v < 1 << 24).ok_or_else(|| {
                GgufError::Corrupt(format!("{}: value {v} out of range", key(k)))
            })
        };
        let n_embd = n("embedding_length")?;
        let n_head = n("attention.head_count")?;
        let n_head_kv = match g.get(&key("attention.head_count_kv")) {
            Some(_) => n("attention.head_count_kv")?,
            None => n_head,
        };
        if n_embd % n_head != 0 || n_head % n_head_kv != 0 {
            return Err(GgufError::Corrupt(format!(
                "heads do not divide: n_embd {n_embd}, n_head {n_head}, n_head_kv {n_head_kv}"
            )));
        }
        let head_dim = n_embd / n_head;
        let rope_dims = match g.get(&key("rope.dimension_count")) {
            Some(_) => n("rope.dimension_count")?,
            None => head_dim,
        };
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(GgufError::Corrupt(format!("rope dimension {rope_dims} invalid for head size {head_dim}")));
        }
        let vocab_size = match g.get(&key("vocab_size")) {
            Some(_) => n("vocab_size")?,
            None => g.array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_base = if g.get(&key("rope.freq_base")).is_some() { g.f32(&key("rope.freq_base"))? } else { 10000.0 };
        let rms_eps = g.f32(&key("attention.layer_norm_rms_epsilon"))?;
        if !(rope_base.is_finite() && rope_base > 0.0 && rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(GgufError::Corrupt(format!("rope base {rope_base} / rms eps {rms_eps} invalid")));
        }
        Ok(LlamaConfig {
            arch: arch.clone(),
            n_layer: n("block_count")?,
            n_embd,
            n_ff: n("feed_forward_length")?,
            n_head,
            n_head_kv,
            head_dim,
            rope_dims,
            rope_base,
            rms_eps,
            vocab_size,
            n_ctx_train: n("context_length")?,
            tied_output: g.tensor_info("output.weight").is_err(),
        })
    }

    /// Width of the K (and V) projection: n_head_kv * head_dim.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
