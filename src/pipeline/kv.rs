//! The KV a computed request reuses, as the pipeline's stages pass it along (tiers, deferred
//! lookups, the engine job): a leaf of the pipeline, so each stage can name it without importing
//! another stage.

use crate::engine::PrefixCache;
use crate::workload::{BlendPlan, KvPlan};

/// What a computed request reuses: a stored prefix, or (BLEND) its documents' KV.
pub(super) enum Kv {
    /// a stored prefix of the prompt (every mode but BLEND)
    Prefix(KvPlan),
    /// BLEND: the documents' KV computed at other positions
    Blend(BlendPlan),
}

impl Kv {
    /// The prefix cache that travels with the job to the engine.
    pub(super) fn into_cache(self) -> Box<dyn PrefixCache> {
        match self {
            Kv::Prefix(p) => Box::new(p),
            Kv::Blend(b) => Box::new(b),
        }
    }
}
