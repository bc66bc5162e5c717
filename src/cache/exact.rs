//! The exact cache. Key = sha256 over (tenant, model id, rendered prompt, max_tokens, the
//! sampling parameters that change the output, stop strings). For a greedy request top-k, top-p
//! and the seed change nothing, so they are left out of its key; a sampled request without a
//! seed is not reproducible and gets no key at all: it is never served from, nor written to,
//! this cache.
//!
//! Two levels: a bounded in-memory map (moka, TinyLFU admission) and, under it, the store's
//! `inferences` rows (see [`Store::find_exact`]). A memory miss that the store answers is
//! promoted into memory.

use std::sync::Arc;

use crate::engine::sampler::SamplingParams;
use crate::store::{sha256_hex, CachedAnswer, Store, StoreError};

/// Version of the key material; bump it when the key's meaning changes.
const KEY_VERSION: u32 = 1;

/// What an exact-cache key is made of.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    /// The tenant the request belongs to.
    pub tenant: &'a str,
    /// The model that serves the request.
    pub model_id: &'a str,
    /// The rendered prompt (after the chat template).
    pub prompt: &'a str,
    /// The request's limit on generated tokens.
    pub max_tokens: usize,
    /// The request's sampling parameters.
    pub sampling: SamplingParams,
    /// The request's stop strings.
    pub stop: &'a [String],
}

/// The key, or `None` when the request may not use the exact cache (sampled without a seed).
pub fn exact_key(p: &KeyParts<'_>) -> Option<String> {
    let s = p.sampling;
    let sampling = if s.is_greedy() {
        serde_json::json!("greedy")
    } else {
        let seed = s.seed?;
        serde_json::json!({ "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "seed": seed })
    };
    let material = serde_json::json!({
        "v": KEY_VERSION,
        "tenant": p.tenant,
        "model": p.model_id,
        "prompt": p.prompt,
        "max_tokens": p.max_tokens,
        "sampling": sampling,
        "stop": p.stop,
    });
    Some(sha256_hex(material.to_string().as_bytes()))
}

pub struct ExactCache {
    memory: moka::sync::Cache<String, Arc<CachedAnswer>>,
    store: Arc<Store>,
}

impl ExactCache {
    /// `capacity`: answers kept in memory.
    pub fn new(store: Arc<Store>, capacity: u64) -> ExactCache {
        ExactCache { memory: moka::sync::Cache::new(capacity), store }
    }

    /// Memory, then the store (blocking: call it off the async executor).
    pub fn get(&self, tenant: &str, key: &str) -> Result<Option<Arc<CachedAnswer>>, StoreError> {
        if let Some(hit) = self.memory.get(key) {
            return Ok(Some(hit));
        }
        Ok(self.store.find_exact(tenant, key)?.map(|answer| {
            let answer = Arc::new(answer);
            self.memory.insert(key.to_string(), answer.clone());
            answer
        }))
    }

    /// Makes `answer` (already recorded in the store) the one served for `key`.
    pub fn put(&self, key: &str, answer: CachedAnswer) {
        self.memory.insert(key.to_string(), Arc::new(answer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(sampling: SamplingParams) -> KeyParts<'static> {
        KeyParts { tenant: "t", model_id: "m", prompt: "p", max_tokens: 8, sampling, stop: &[] }
    }

    #[test]
    fn greedy_keys_ignore_irrelevant_knobs() {
        let g = exact_key(&parts(SamplingParams::greedy())).expect("key");
        let g2 = exact_key(&parts(SamplingParams { top_k: 5, top_p: 0.5, seed: Some(3), ..SamplingParams::greedy() })).expect("key");
        assert_eq!(g, g2);
        assert_ne!(g, exact_key(&KeyParts { max_tokens: 9, ..parts(SamplingParams::greedy()) }).expect("key"));
        assert_ne!(g, exact_key(&KeyParts { tenant: "u", ..parts(SamplingParams::greedy()) }).expect("key"));
        assert_ne!(g, exact_key(&KeyParts { model_id: "n", ..parts(SamplingParams::greedy()) }).expect("key"));
        let stop = ["\n".to_string()];
        assert_ne!(g, exact_key(&KeyParts { stop: &stop, ..parts(SamplingParams::greedy()) }).expect("key"));
    }

    #[test]
    fn sampled_requests_need_a_seed() {
        let hot = SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.9, seed: None };
        assert_eq!(exact_key(&parts(hot)), None);
        let a = exact_key(&parts(SamplingParams { seed: Some(1), ..hot })).expect("key");
        let b = exact_key(&parts(SamplingParams { seed: Some(2), ..hot })).expect("key");
        assert_ne!(a, b);
    }
}
