//! The inference engine: a model from GGUF (`llama`, `qwen2`, `qwen3`, `gemma3`, `phi3`), run
//! through a [`crate::backend::Backend`].
//!
//! * `config` — hyper-parameters and architecture parts from GGUF metadata ([`ModelConfig`])
//! * `weights` — zero-copy weight views, shape-checked at load
//! * `kv` — per-sequence KV cache
//! * `model` — the forward pass over a batch of sequences
//! * `tokenizer` — byte-level BPE (on the `tokenizers` crate) and SentencePiece from GGUF metadata, special tokens
//! * `chat` — the GGUF chat template (or a built-in one) rendered with minijinja
//! * `sampler` — greedy / temperature / top-k / top-p sampling, seeded
//! * `generate` — prefill + decode loop on token ids, with timings
//! * `prefix` — [`PrefixCache`], what the engine needs from a prefix cache (`workload` implements it)
//! * `blend` — BLEND: spans of KV computed elsewhere, re-rotated into place, partly recomputed
//! * `scheduler` — continuous batching: one engine thread, a bounded queue, shared forward passes
//! * `job` — what the scheduler is given (a job, its drafts) and gives back (events, how it ended)
//! * `fair` — the scheduler's policy: slots per tenant, step budget in time, prompt chunks shared per tenant
//! * `eval` — perplexity (llama.cpp's method)
//! * `offload` — the model's side of the layer-offload seam: its tensors for a backend, its list of
//!   offloaded segments (`backend::offload::LayerOffload`)
//! * `placement` — which layers run on the CPU and which on the GPU (`--backend`, `--tensor-split`)
//! * `bench` — llama-bench-style speed tests (ppN, tgN, tgN@dD)

pub mod blend;
pub mod chat;
pub mod bench;
pub mod config;
pub mod eval;
pub mod fair;
pub mod generate;
pub mod job;
pub mod kv;
pub mod model;
pub mod offload;
pub mod placement;
pub mod prefix;
pub mod sampler;
pub mod scheduler;
pub mod tokenizer;
pub mod weights;

pub use config::{Arch, LlamaConfig, ModelConfig};
pub use kv::KvCache;
pub use prefix::PrefixCache;
pub use model::{Logits, Model, ModelError, RunState, SeqBatch};
