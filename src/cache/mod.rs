//! Response caches in front of the engine.
//!
//! * `exact` — the exact cache: the same tenant, model, rendered prompt and output-changing
//!   sampling parameters get the recorded answer back without touching the model. Memory
//!   (moka) over the store's `inferences` rows, so hits survive a restart.
//!
//! * `semantic` — answers of similar earlier questions (MiniLM + sqlite-vec): drafts that the
//!   model verifies (VERIFIED/PARTIAL), or served as they are when the learned `trust` decision
//!   bounds the error rate (TRUST).
//! * `trust` — fitting that decision on the outcomes of verified checks.
//! * `equivalent` — EQUIVALENT: the model scores a neighbour's answer under the new prompt in
//!   one teacher-forced pass; a region of scores learned without labels decides what is served.
//! * `skip` — VERIFIED's draft skipping where drafts do not pay (learned acceptance floor).
//! * `indexer` — fact embeddings in the background, yielding to requests.
//!
//! The FACT tier (a live user-provided fact answering the question) is a store lookup
//! ([`crate::store::Store::fact_answer`]).

pub mod equivalent;
pub mod exact;
pub mod indexer;
pub mod semantic;
pub mod skip;
pub mod trust;

pub use exact::{exact_key, ExactCache, KeyParts};
