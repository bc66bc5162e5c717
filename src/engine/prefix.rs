//! What the engine needs from a prefix cache, and nothing more: a [`PrefixCache`] travels with a
//! job to the engine thread, loads the reusable prefix of the prompt into the sequence's empty
//! KV cache at admission, is told what the sequence computed (once its prompt is prefilled, and
//! at the end), and comes back by value with the finished result
//! ([`super::scheduler::Finished::prefix`]). The engine never sees keys, tiers or storage:
//! those stay in `workload`, which implements this trait. A cache may offer a [`Blend`] instead
//! of a prefix (cache mode BLEND): spans of KV computed elsewhere, which the engine blends in
//! (the data lives here, beside the trait that offers it; the algorithm in [`super::blend`]).

use std::any::Any;

use super::KvCache;

pub trait PrefixCache: Send + std::fmt::Debug {
    /// Loads the reusable prefix of `prompt` into the empty cache `kv` and returns how many
    /// positions it holds now: the positions the sequence need not compute. Must leave at least
    /// the last prompt token to compute (its logits give the first token); on failure, leaves
    /// `kv` empty and returns 0.
    fn load(&mut self, kv: &mut KvCache, prompt: &[u32]) -> usize;

    /// `kv` holds the keys and values of `prompt` followed by `generated` (up to `kv.len()`
    /// positions): the cache may keep what it has not seen yet. Called when the prompt is
    /// prefilled and again when the sequence finishes.
    fn publish(&mut self, kv: &KvCache, prompt: &[u32], generated: &[u32]);

    /// BLEND: spans of the prompt whose KV comes from elsewhere, to blend instead of loading a
    /// prefix ([`super::blend`]); `None` (the default) for a prefix cache.
    fn blend(&mut self) -> Option<&mut Blend> {
        None
    }

    /// Gives the cache back to its owner as its concrete type.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// One span of the prompt whose KV comes from elsewhere.
#[derive(Debug)]
pub struct ReusedSpan {
    /// Position in the prompt of the span's first token.
    pub at: usize,
    /// The span's own sequence: `base` tokens of leading context, then the span's tokens (equal
    /// to the prompt's at `at..`). Its KV is what `cache` holds.
    pub tokens: Vec<u32>,
    /// Leading tokens of `tokens` before the span (at least 1 with a non-empty span).
    pub base: usize,
    /// Loads the KV of `tokens` it holds; is told when the engine computed the rest.
    pub cache: Box<dyn PrefixCache>,
}

impl ReusedSpan {
    /// Tokens of the span.
    pub fn len(&self) -> usize {
        self.tokens.len().saturating_sub(self.base)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a prefix cache offers instead of a prefix: the spans and how much to recompute.
#[derive(Debug, Default)]
pub struct Blend {
    /// Spans in prompt order, not overlapping.
    pub spans: Vec<ReusedSpan>,
    /// Fraction of the moved spans' tokens (not in an exact prefix) recomputed in every layer
    /// after the check layers (0 ..= 1).
    pub recompute: f32,
    /// What the engine did, once admitted.
    pub report: BlendReport,
}

/// What BLEND did for one prompt.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BlendReport {
    /// Span tokens that kept the reused KV after the check layers.
    pub reused: usize,
    /// Span tokens recomputed in every layer.
    pub recomputed: usize,
    /// Span tokens whose own KV the span caches held.
    pub loaded: usize,
    /// Tokens computed for the spans' own KV (their first sight, or what their caches lacked).
    pub span_computed: usize,
    /// Prompt tokens outside the spans, computed (all but an exact first span's lead, which is
    /// loaded with it).
    pub other: usize,
    /// Span tokens of an exact prefix (a first span whose own sequence is the prompt's start:
    /// its KV is the full prefill's, loaded and kept; counted in `reused`).
    pub exact: usize,
    /// Why BLEND fell back to a full prefill (`None`: blended).
    pub fallback: Option<String>,
}
