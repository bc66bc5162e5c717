//! What the engine needs from a prefix cache, and nothing more: a [`PrefixCache`] travels with a
//! job to the engine thread, loads the reusable prefix of the prompt into the sequence's empty
//! KV cache at admission, is told what the sequence computed (once its prompt is prefilled, and
//! at the end), and comes back by value with the finished result
//! ([`super::scheduler::Finished::prefix`]). The engine never sees keys, tiers or storage:
//! those stay in `workload`, which implements this trait. A cache may offer a [`Blend`] instead
//! of a prefix (cache mode BLEND): spans of KV computed elsewhere, which the engine blends in.

use std::any::Any;

use super::blend::Blend;
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
