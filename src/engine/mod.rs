//! The inference engine: a Llama-family model from GGUF, run through a [`crate::backend::Backend`].
//!
//! * `config` — hyper-parameters from GGUF metadata
//! * `weights` — zero-copy weight views, shape-checked at load
//! * `kv` — per-sequence KV cache
//! * `model` — the forward pass over a batch of sequences
//! * `tokenizer` — byte-level BPE from GGUF metadata (on the `tokenizers` crate), special tokens
//! * `chat` — the GGUF chat template rendered with minijinja
//! * `sampler` — greedy / temperature / top-k / top-p sampling, seeded
//! * `generate` — prefill + decode loop on token ids, with timings
//! * `scheduler` — continuous batching: one engine thread, a bounded queue, shared forward passes
//! * `fair` — the scheduler's policy: slots per tenant, step budget in time, prompt chunks shared per tenant
//! * `eval` — perplexity (llama.cpp's method)
//! * `offload` — the model's side of the layer-offload seam: its tensors for a backend, its list of
//!   offloaded segments (`backend::offload::LayerOffload`)
//! * `placement` — which layers run on the CPU and which on the GPU (`--backend`, `--tensor-split`)
//! * `bench` — llama-bench-style speed tests (ppN, tgN, tgN@dD)

pub mod chat;
pub mod bench;
pub mod config;
pub mod eval;
pub mod fair;
pub mod generate;
pub mod kv;
pub mod model;
pub mod offload;
pub mod placement;
pub mod sampler;
pub mod scheduler;
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use kv::KvCache;
pub use model::{Logits, Model, ModelError, RunState, SeqBatch};
