//! forge-cache: an LLM inference engine and service that reuses what it has already computed.
//!
//! Map of the modules (the request path runs top to bottom):
//!
//! | module     | what lives there |
//! |------------|------------------|
//! | `gguf`     | GGUF parsing, memory-mapped zero-copy tensor views, block formats and reference dequantizers |
//! | `engine`   | the Llama model (weights apart from run state, KV cache), tokenizer + chat template, sampler, generation loop |
//! | `backend`  | the narrow `Backend` trait of forward-pass kernels; `cpu` (scalar reference + SIMD); hardware detection and tiers |
//! | `embed`    | all-MiniLM-L6-v2 sentence embedder (BERT from safetensors) on the same CPU kernels |
//! | `models`   | where model files live (`$FORGE_MODELS_DIR` or the git-ignored `models/` filled by `scripts/fetch-models.sh`) |
//!
//! Planned (issues 4–7): `server` (gRPC), `cache` (exact + semantic), `workload` (KV block reuse),
//! `store` (SQLite knowledge store), `backend::wgpu`, `backend::hip`.
//! The command-line interface lives in the binary (`src/main.rs`, `src/cli/`).

pub mod backend;
pub mod cache;
pub mod embed;
pub mod engine;
pub mod gguf;
pub mod models;
pub mod server;
pub mod store;
