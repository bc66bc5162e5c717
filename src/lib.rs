//! forge-cache: an LLM inference engine and service that reuses what it has already computed.
//!
//! Map of the modules (the request path runs top to bottom):
//!
//! | module     | what lives there |
//! |------------|------------------|
//! | `server`   | the front ends, translating only: the gRPC service (tonic: Generate, stats, facts API, reflection, health; a client) and `server::http`, the OpenAI-compatible HTTP API (axum: chat/completions, SSE, /health, /metrics); the process that runs both |
//! | `pipeline` | the one request pipeline both front ends call: validation (render, tokenize, keys), the cache tiers (calls into `cache`), the engine job, recording (store, caches, metrics, the request's log line); tenants; Prometheus metrics |
//! | `cache`    | response caches in front of the engine: the exact cache (moka over the store); the semantic tier (MiniLM + sqlite-vec neighbours as verified drafts) and TRUST decisions |
//! | `store`    | the knowledge store, SQLite (embedded default) or PostgreSQL + pgvector (`store::pg`, replicas): inferences, facts, relationships, reasoning chains; migrations, stats, read-only SQL |
//! | `workload` | KV-block reuse: block keys per tenant, the memory index and the disk tier of KV blocks, the plan the engine loads a prompt's stored prefix from; BLEND's chunk keys and plan |
//! | `engine`   | the model of every GGUF architecture it runs (llama, qwen2, qwen3, gemma3, phi3: config, weights apart from run state, KV cache), tokenizers (BPE, SentencePiece) + chat template, sampler, generation loop, continuous-batching scheduler with draft verification; `engine::offload` keeps the model's list of offloaded layer segments, `engine::placement` chooses them |
//! | `backend`  | the narrow `Backend` trait of forward-pass kernels; `offload`: the `LayerOffload` interface through which the engine runs layers `[a, b)` on an accelerator (activations and KV behind opaque handles); `cpu` (scalar reference + SIMD, repacked weight layouts); `wgpu` (WGSL kernels: `Backend` op by op, and a `LayerOffload` segment); `hip` (kernels/hip through hipcc on AMD or the CUDA driver on NVIDIA: the second `LayerOffload`); `simd` and `hardware` detection and tiers. Nothing in `backend` imports the engine |
//! | `gguf`     | GGUF parsing, memory-mapped zero-copy tensor views, block formats, reference dequantizers and quantizers, synthetic models |
//! | `embed`    | all-MiniLM-L6-v2 sentence embedder (BERT from safetensors) on the same CPU kernels |
//! | `vocab`    | the ground-floor words every layer shares: `StopReason`, `CacheMode`, `ServedFrom` |
//! | `rng`      | ground floor: the seeded SplitMix64 generator (sampling, synthetic models) |
//! | `background` | ground floor: a value built on its own thread while start-up goes on (the model's tokenizer, the sentence embedder); the first caller that needs it waits |
//! | `models`   | where model files live (`$FORGE_MODELS_DIR` or the git-ignored `models/` filled by `scripts/fetch-models.sh`) |
//!
//! The command-line interface lives in the binary (`src/main.rs`, `src/cli/`).

pub mod background;
pub mod backend;
pub mod cache;
pub mod embed;
pub mod engine;
pub mod gguf;
pub mod models;
pub mod pipeline;
pub mod rng;
pub mod server;
pub mod store;
pub mod vocab;
pub mod workload;
