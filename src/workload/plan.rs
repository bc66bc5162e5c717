//! The engine's side of KV reuse: a [`KvPlan`] is the [`PrefixCache`] a request's job carries to
//! the engine thread. At admission it loads the reusable prefix into the sequence's KV cache;
//! once the prompt is prefilled, and again when the sequence finishes, it publishes the blocks
//! the sequence computed into the memory index and keeps them in its [`ReportData`]; it comes
//! back by value with the finished result, and the pipeline stores the new blocks once the
//! request is recorded ([`super::KvWorkload::finish`]).
//!
//! Block keys are derived here and only here ([`KvPlan::extend_keys`], over the plan's
//! [`ChainSeed`]): for the prompt when the plan is prepared, for the generated tokens when they
//! are published.

use std::any::Any;
use std::sync::Arc;

use super::disk::NewBlock;
use super::index::{Block, Geometry, MemoryIndex};
use super::keys::{BlockKey, ChainSeed};
use crate::engine::{KvCache, PrefixCache};

/// What one request reused and computed.
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
    /// Prompt positions whose KV was loaded instead of computed (planned when prepared, what
    /// was loaded once the engine admitted the sequence).
    pub reused_tokens: usize,
    /// Keys of the blocks the loaded positions came from.
    pub used: Vec<BlockKey>,
    /// Blocks the sequence computed that memory did not hold yet.
    pub new_blocks: Vec<NewBlock>,
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
    pub(super) report: ReportData,
}

impl std::fmt::Debug for KvPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvPlan").field("blocks", &self.keys.len()).field("hits", &self.hits.len()).finish()
    }
}

impl KvPlan {
    /// Extends the plan's keys to every whole block of `tokens` (the prompt, then the prompt
    /// and the generated tokens): the one place block keys are derived.
    pub(super) fn extend_keys(&mut self, tokens: &[u32]) {
        self.seed.extend(&mut self.keys, tokens);
    }

    /// Positions of `prompt` the hits can give: at least the last prompt token is computed.
    pub(super) fn loadable(&self, prompt: &[u32]) -> usize {
        (self.hits.len() * self.geom.block_tokens).min(prompt.len().saturating_sub(1))
    }

    /// What the request reused and computed (after the engine gave the plan back).
    pub fn into_report(self) -> ReportData {
        self.report
    }

    /// The numbers so far (before the engine ran: what is planned).
    pub fn report(&self) -> &ReportData {
        &self.report
    }
}

impl PrefixCache for KvPlan {
    fn load(&mut self, kv: &mut KvCache, prompt: &[u32]) -> usize {
        let b = self.geom.block_tokens;
        let n = self.loadable(prompt);
        let mut at = 0;
        let mut used = Vec::new();
        for (i, block) in self.hits.iter().enumerate() {
            if at >= n {
                break;
            }
            let take = b.min(n - at);
            if kv.append_block(&block.k, &block.v, b, take).is_err() {
                kv.truncate(0);
                at = 0;
                used.clear();
                break;
            }
            used.push(self.keys[i]);
            at += take;
        }
        self.hits.clear();
        self.report.reused_tokens = at;
        self.report.used = used;
        at
    }

    /// Publishes the whole blocks among the positions `kv` holds (the prompt, then the
    /// generated tokens fed back) that are not resident yet.
    fn publish(&mut self, kv: &KvCache, prompt: &[u32], generated: &[u32]) {
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
        self.extend_keys(tokens);
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
        self.report.new_blocks.extend(fresh);
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}
