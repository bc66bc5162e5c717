//! The engine's side of KV reuse: a [`KvPlan`] travels with a request's job to the engine
//! thread. At admission it loads the reusable prefix into the sequence's KV cache
//! ([`KvPlan::load`]); once the prompt is prefilled, and again when the sequence finishes, it
//! publishes the blocks the sequence computed ([`KvPlan::publish`]) into the memory index and
//! into the request's [`KvReport`], from which the server stores them once the request is
//! recorded.

use std::sync::{Arc, Mutex, MutexGuard};

use super::disk::NewBlock;
use super::index::{Block, Geometry, MemoryIndex};
use super::keys::{BlockKey, ChainSeed};
use crate::engine::KvCache;

/// What one request reused and computed (shared by the engine and the server).
#[derive(Debug, Default)]
pub struct KvReport {
    inner: Mutex<ReportData>,
}

#[derive(Debug, Default, Clone)]
pub struct ReportData {
    /// Whole blocks of the prompt.
    pub prompt_blocks: usize,
    /// Of the reusable prefix: blocks found in memory, blocks read from disk.
    pub blocks_memory: usize,
    pub blocks_disk: usize,
    /// Stored blocks that failed their checksum (recomputed instead).
    pub blocks_corrupt: usize,
    /// Time to find (and read) the prefix, before the job was queued.
    pub load_ms: f64,
    /// Prompt positions whose KV was loaded instead of computed.
    pub reused_tokens: usize,
    /// Keys of the blocks the loaded positions came from.
    pub used: Vec<BlockKey>,
    /// Blocks the sequence computed that memory did not hold yet.
    pub new_blocks: Vec<NewBlock>,
}

impl KvReport {
    pub fn lock(&self) -> MutexGuard<'_, ReportData> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn reused_tokens(&self) -> usize {
        self.lock().reused_tokens
    }
}

pub struct KvPlan {
    pub(super) geom: Geometry,
    pub(super) seed: ChainSeed,
    /// Keys of the whole blocks of the prompt (then of the generated tokens too).
    pub(super) keys: Vec<BlockKey>,
    /// The reusable prefix, in order (released once loaded).
    pub(super) hits: Vec<Arc<Block>>,
    /// Blocks of `keys` already resident or published.
    pub(super) published: usize,
    pub(super) memory: MemoryIndex,
    pub(super) report: Arc<KvReport>,
}

impl std::fmt::Debug for KvPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPlan").field("blocks", &self.keys.len()).field("hits", &self.hits.len()).finish()
    }
}

impl KvPlan {
    /// Loads the reusable prefix of `prompt` into the empty cache `kv` and returns its length:
    /// the positions the sequence need not compute. At least the last prompt token is always
    /// left to compute (its logits give the first token).
    pub fn load(&mut self, kv: &mut KvCache, prompt: &[u32]) -> usize {
        let b = self.geom.block_tokens;
        let n = (self.hits.len() * b).min(prompt.len().saturating_sub(1));
        let mut at = 0;
        let mut used = Vec::new();
        for (i, block) in self.hits.iter().enumerate() {
            if at >= n {
                break;
            }
            let take = b.min(n - at);
            if kv.append_block(&block.k, &block.v, b, take).is_err() {
                kv.truncate(0);
                return 0;
            }
            used.push(self.keys[i]);
            at += take;
        }
        self.hits.clear();
        let mut r = self.report.lock();
        r.reused_tokens = at;
        r.used = used;
        at
    }

    /// Publishes the whole blocks among the positions `kv` holds (the prompt, then the
    /// generated tokens fed back) that are not resident yet.
    pub fn publish(&mut self, kv: &KvCache, prompt: &[u32], generated: &[u32]) {
        let b = self.geom.block_tokens;
        let valid = kv.len().min(prompt.len() + generated.len());
        let whole = valid / b;
        if whole <= self.published {
            return;
        }
        let joined: Vec<u32>;
        let tokens: &[u32] = if valid <= prompt.len() {
            &prompt[..valid]
        } else {
            joined = prompt.iter().chain(generated).copied().take(valid).collect();
            &joined
        };
        self.seed.extend(&mut self.keys, tokens);
        let mut fresh = Vec::new();
        for i in self.published..whole.min(self.keys.len()) {
            let key = self.keys[i];
            if self.memory.contains(&key) {
                continue;
            }
            let Ok(block) = Block::from_cache(&self.geom, kv, i * b) else { break };
            let block = Arc::new(block);
            self.memory.insert(key, block.clone());
            let parent = (i > 0).then(|| self.keys[i - 1]);
            fresh.push(NewBlock { key, parent, position: i * b, tokens: tokens[i * b..(i + 1) * b].to_vec(), block });
        }
        self.published = whole;
        self.report.lock().new_blocks.extend(fresh);
    }

    pub fn report(&self) -> &Arc<KvReport> {
        &self.report
    }
}
