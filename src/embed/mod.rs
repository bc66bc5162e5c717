//! all-MiniLM-L6-v2 sentence embedder: a BERT encoder loaded from safetensors, run on the same
//! [`Backend`] kernels as the Llama engine, with mean pooling over real tokens and L2
//! normalization (what sentence-transformers computes for this model).
//!
//! * `config` — hyper-parameters from `config.json`.
//! * `weights` — the memory-mapped safetensors file, every tensor checked by name, dtype, shape.
//! * `forward` — the encoder, a bidirectional f32 attention helper, pooling.
//!
//! Padding: the model's `tokenizer.json` pads every input to 128 tokens. Padding is switched off
//! here and truncation set to 256 tokens (sentence-transformers' `max_seq_length`), so every
//! token the encoder sees is a real one; batches concatenate texts of different lengths and
//! attention never crosses from one text to another.

mod config;
mod forward;
mod weights;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use tokenizers::{Tokenizer, TruncationParams};

pub use self::config::BertConfig;
use self::forward::Buffers;
use self::weights::Weights;
use crate::backend::{Backend, Op};

/// sentence-transformers' `max_seq_length` for all-MiniLM-L6-v2: inputs are truncated there.
pub const MAX_SEQ_LEN: usize = 256;

/// Tokens per forward pass in [`Embedder::embed_batch`]: bounds the activation buffers
/// (about 2048 × (6 × 384 + 1536) floats ≈ 31 MB) however many texts are passed.
const MAX_BATCH_TOKENS: usize = 2048;

/// Errors of loading the model or embedding text.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid config.json: {source}", path.display())]
    ConfigParse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("unsupported model configuration: {0}")]
    Config(String),
    #[error("{}: invalid safetensors file: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("corrupt safetensors file: {0}")]
    Corrupt(String),
    #[error("tensor `{0}` is missing from the safetensors file")]
    MissingTensor(String),
    #[error("tensor `{name}` has dtype {dtype}; expected F32, F16 or BF16")]
    Dtype { name: String, dtype: String },
    #[error("tensor `{name}` has shape {got:?}; config.json implies {expected:?}")]
    Shape { name: String, expected: Vec<usize>, got: Vec<usize> },
    #[error("backend {backend} cannot run matmul on {ty:?} weights")]
    Unsupported { backend: String, ty: crate::gguf::GgmlType },
    #[error("{}: cannot load tokenizer: {msg}", path.display())]
    TokenizerLoad { path: PathBuf, msg: String },
    #[error("tokenizer failed: {0}")]
    Tokenize(String),
    #[error("token id {id} is outside the model's vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("{len} tokens exceed the model's {max} positions")]
    TooLong { len: usize, max: usize },
}

/// One text's embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The token ids the encoder saw ([CLS] … [SEP], no padding).
    pub token_ids: Vec<u32>,
    /// [dim], unit L2 norm
    pub vector: Vec<f32>,
}

/// The sentence embedder. Immutable after loading; `Send + Sync`, so one instance can serve
/// concurrent callers (each call allocates its own activation buffers).
pub struct Embedder {
    backend: Arc<dyn Backend>,
    tokenizer: Tokenizer,
    cfg: BertConfig,
    /// the whole `model.safetensors`, mapped read-only; `weights` holds byte ranges into it
    map: Mmap,
    weights: Weights,
    /// truncation length: min(MAX_SEQ_LEN, max_position_embeddings)
    max_seq: usize,
}

/// Where the model lives (see `crate::models`).
pub fn default_dir() -> PathBuf {
    crate::models::default_embedder()
}

/// Whether `backend` can run a matmul on every matrix of `weights`.
fn check_backend(weights: &Weights, backend: &dyn Backend) -> Result<(), EmbedError> {
    match weights.matrix_types().find(|&ty| !backend.supports(Op::MatMul, ty)) {
        Some(ty) => Err(EmbedError::Unsupported { backend: backend.name(), ty }),
        None => Ok(()),
    }
}

/// How the encoder's matrices are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatrixFormat {
    /// As the safetensors file stores them (all-MiniLM-L6-v2: F32).
    #[default]
    AsStored,
    /// F32 matrices rounded to F16 at load: half the bytes per embedding, which is a stream of
    /// weight reads (the service's default). all-MiniLM-L6-v2's vectors move by 1 - cos ~ 4e-7
    /// (tests/embed_reference.rs holds them to the same 0.9999 as the F32 ones).
    F16,
}

impl Embedder {
    /// Loads `config.json`, `model.safetensors` and `tokenizer.json` from `dir`.
    pub fn load(dir: &Path, backend: Arc<dyn Backend>) -> Result<Embedder, EmbedError> {
        Self::load_with(dir, backend, MatrixFormat::AsStored)
    }

    /// [`Embedder::load`], holding the matrices in `format`.
    pub fn load_with(dir: &Path, backend: Arc<dyn Backend>, format: MatrixFormat) -> Result<Embedder, EmbedError> {
        let cfg = BertConfig::from_file(&dir.join("config.json"))?;

        let path = dir.join("model.safetensors");
        let file = std::fs::File::open(&path).map_err(|source| EmbedError::Io { path: path.clone(), source })?;
        // SAFETY: the map is read-only and private. The model files are treated as immutable
        // while the process runs; if another process truncated the file under us, reads would
        // fault (SIGBUS) — the same contract as the GGUF loader. Every range later read from the
        // map has been checked against its length.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| EmbedError::Io { path: path.clone(), source })?;
        let mut weights = Weights::load(&map, &cfg, &path)?;
        if format == MatrixFormat::F16 {
            weights.hold_f16(&map).map_err(|source| EmbedError::Io { path: path.clone(), source })?;
        }
        check_backend(&weights, backend.as_ref())?;

        let max_seq = MAX_SEQ_LEN.min(cfg.max_position_embeddings);
        let tpath = dir.join("tokenizer.json");
        let tok_err = |msg: String| EmbedError::TokenizerLoad { path: tpath.clone(), msg };
        let mut tokenizer = Tokenizer::from_file(&tpath).map_err(|e| tok_err(e.to_string()))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_seq, ..Default::default() }))
            .map_err(|e| tok_err(e.to_string()))?;

        Ok(Embedder { backend, tokenizer, cfg, map, weights, max_seq })
    }

    /// Embedding dimension (`hidden_size`).
    pub fn dim(&self) -> usize {
        self.cfg.hidden_size
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &BertConfig {
        &self.cfg
    }

    /// Token ids of `text` as the encoder sees them: [CLS] … [SEP], truncated, never padded.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, EmbedError> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| EmbedError::Tokenize(e.to_string()))?;
        let ids = enc.get_ids().to_vec();
        if ids.len() > self.max_seq {
            return Err(EmbedError::TooLong { len: ids.len(), max: self.max_seq });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.cfg.vocab_size) {
            return Err(EmbedError::TokenOutOfRange { id, vocab: self.cfg.vocab_size });
        }
        Ok(ids)
    }

    /// Embeds one text.
    pub fn embed(&self, text: &str) -> Result<Embedding, EmbedError> {
        self.embed_on(self.backend.as_ref(), text)
    }

    /// [`Embedder::embed`] on another backend (see [`Embedder::embed_batch_on`]).
    pub fn embed_on(&self, backend: &dyn Backend, text: &str) -> Result<Embedding, EmbedError> {
        let mut v = self.embed_batch_on(backend, &[text])?;
        v.pop().ok_or_else(|| EmbedError::Tokenize("no output for the input".to_string()))
    }

    /// Embeds several texts. Each result equals (bitwise) what [`Embedder::embed`] returns for
    /// that text alone: texts are concatenated token-wise and attend only to themselves.
    pub fn embed_batch(&self, texts: &[&str]) -> Result<Vec<Embedding>, EmbedError> {
        self.embed_batch_on(self.backend.as_ref(), texts)
    }

    /// [`Embedder::embed_batch`] on another backend (e.g. a wider thread team while it is free).
    /// The CPU kernels' results do not depend on the thread count, so neither do the vectors.
    pub fn embed_batch_on(&self, backend: &dyn Backend, texts: &[&str]) -> Result<Vec<Embedding>, EmbedError> {
        check_backend(&self.weights, backend)?;
        let ids = texts.iter().map(|t| self.tokenize(t)).collect::<Result<Vec<_>, _>>()?;
        // Consecutive texts in chunks of at most MAX_BATCH_TOKENS tokens (a longer text alone).
        let mut chunks: Vec<std::ops::Range<usize>> = Vec::new();
        let (mut start, mut tokens) = (0, 0);
        for (i, s) in ids.iter().enumerate() {
            if i > start && tokens + s.len() > MAX_BATCH_TOKENS {
                chunks.push(start..i);
                (start, tokens) = (i, 0);
            }
            tokens += s.len();
        }
        if start < ids.len() {
            chunks.push(start..ids.len());
        }
        let cap = chunks.iter().map(|c| ids[c.clone()].iter().map(Vec::len).sum::<usize>()).max().unwrap_or(0);
        let max_seq = ids.iter().map(Vec::len).max().unwrap_or(0);
        let mut buf = Buffers::new(&self.cfg, cap, max_seq);

        let mut out = Vec::with_capacity(ids.len());
        for c in chunks {
            let seqs: Vec<&[u32]> = ids[c.clone()].iter().map(Vec::as_slice).collect();
            let vecs = forward::encode(backend, &self.map, &self.weights, &self.cfg, &seqs, &mut buf);
            out.extend(ids[c].iter().zip(vecs).map(|(t, v)| Embedding { token_ids: t.clone(), vector: v }));
        }
        Ok(out)
    }
}
