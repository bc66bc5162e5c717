//! Response caches in front of the engine.
//!
//! * `exact` — the exact cache: the same tenant, model, rendered prompt and output-changing
//!   sampling parameters get the recorded answer back without touching the model. Memory
//!   (moka) over the store's `inferences` rows, so hits survive a restart.
//!
//! The FACT tier (a live user-provided fact answering the question) is a store lookup
//! ([`crate::store::Store::fact_answer`]); the semantic tier and KV-prefix reuse come later.

pub mod exact;

pub use exact::{exact_key, ExactCache, KeyParts};
