//! `config.json` of a BERT checkpoint (Hugging Face `BertConfig`): the hyper-parameters the
//! embedder needs, read with serde and checked before any weight is looked at.

use std::path::Path;

use serde::Deserialize;

use super::EmbedError;

/// The fields of `config.json` the encoder uses. Unknown fields are ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (head size = hidden_size / heads).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the position embedding table: the longest input, in tokens.
    pub max_position_embeddings: usize,
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_type_vocab() -> usize {
    2
}

fn default_eps() -> f64 {
    1e-12
}

fn default_act() -> String {
    "gelu".to_string()
}

impl BertConfig {
    /// Reads and validates `path` (a `config.json`).
    pub fn from_file(path: &Path) -> Result<BertConfig, EmbedError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| EmbedError::Io { path: path.to_path_buf(), source })?;
        let cfg: BertConfig = serde_json::from_str(&text)
            .map_err(|source| EmbedError::ConfigParse { path: path.to_path_buf(), source })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Rejects configurations this encoder cannot run (or that would make it divide by zero).
    pub fn validate(&self) -> Result<(), EmbedError> {
        let bad = |msg: String| Err(EmbedError::Config(msg));
        if self.hidden_size == 0
            || self.num_hidden_layers == 0
            || self.num_attention_heads == 0
            || self.intermediate_size == 0
            || self.max_position_embeddings == 0
            || self.vocab_size == 0
            || self.type_vocab_size == 0
        {
            return bad("sizes must be positive".to_string());
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        // "gelu" in transformers is the exact erf form, which is what the backend computes;
        // "gelu_new" / "gelu_pytorch_tanh" are the tanh approximation and would drift.
        if self.hidden_act != "gelu" {
            return bad(format!("hidden_act {:?} is not supported (only \"gelu\")", self.hidden_act));
        }
        if let Some(p) = &self.position_embedding_type {
            if p != "absolute" {
                return bad(format!("position_embedding_type {p:?} is not supported (only \"absolute\")"));
            }
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {} is not a finite non-negative number", self.layer_norm_eps));
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}
