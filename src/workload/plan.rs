//! The engine's side of KV reuse: a [`KvPlan`] is the [`PrefixCache`] a request's job carries to
//! the engine thread. At admission it loads the reusable prefix into the sequence's KV cache;
//! once the prompt is prefilled, and again when the sequence finishes, it publishes the blocks
//! the sequence computed into the memory index and keeps them in its [`ReportData`]; it comes
//! back by value with the finished result, and the pipeline stores the new blocks once the
//! request is recorded ([`super::KvWorkload::finish`]).
//!
//! Reuse is token-granular: after the whole blocks whose keys match, the plan may hold one more
//! stored block that follows the same parent and shares the prompt's next tokens (the prompt
//! diverges inside it, or it is the tail of a shorter stored sequence): its leading shared
//! positions are loaded too. They are the same tokens after the same prefix at the same
//! positions, so their keys and values are the ones the model would compute (lossless). The
//! sequence's own tail (its last, partial block) is published as a block of fewer tokens.
//!
//! Block keys are derived here and only here ([`KvPlan::extend_keys`], over the plan's
//! [`ChainSeed`]): for the prompt when the plan is prepared, for the generated tokens when they
//! are published.

use std::any::Any;
use std::sync::Arc;

use super::disk::NewBlock;
use super::index::{Block, Child, Geometry, MemoryIndex};
use super::keys::{BlockKey, ChainSeed};
use crate::engine::{KvCache, PrefixCache};

/// What one request reused and computed.
#[derive(Debug, Default, Clone)]
pub struct ReportData {
    /// Whole blocks of the prompt.
    pub prompt_blocks: usize,
    /// Of the reusable prefix: blocks found in memory, blocks read from disk.
    pub blocks_memory: usize,
    /// (see `blocks_memory`)
    pub blocks_disk: usize,
    /// Stored blocks that failed their checksum (recomputed instead).
    pub blocks_corrupt: usize,
    /// Time to find (and read) the prefix, before the job was queued.
    pub load_ms: f64,
    /// Prompt positions whose KV was loaded instead of computed (planned when prepared, what
    /// was loaded once the engine admitted the sequence).
    pub reused_tokens: usize,
    /// Of `reused_tokens`, those loaded from the leading part of a block the prompt diverges
    /// inside (or of a stored tail).
    pub partial_tokens: usize,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Keys of the blocks the loaded positions came from.
    pub used: Vec<BlockKey>,
    /// Blocks the sequence computed that memory did not hold yet.
    pub new_blocks: Vec<NewBlock>,
}

pub struct KvPlan {
    /// Shape of a block for this model.
    pub(super) geom: Geometry,
    /// What this tenant's and model's block keys start from.
    pub(super) seed: ChainSeed,
    /// Keys of the whole blocks of the prompt (then of the generated tokens too).
    pub(super) keys: Vec<BlockKey>,
    /// The reusable prefix, in order (released once loaded).
    pub(super) hits: Vec<Arc<Block>>,
    /// The stored block after the hits that shares the prompt's next tokens, and how many.
    pub(super) partial: Option<(BlockKey, Arc<Block>, usize)>,
    /// Blocks of `keys` already resident or published.
    pub(super) published: usize,
    /// Key of the last partial tail published.
    pub(super) tail: Option<BlockKey>,
    /// The resident blocks (shared with the workload).
    pub(super) memory: MemoryIndex,
    /// What reuse did so far ([`KvPlan::into_report`] hands it back).
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

    /// Positions of `prompt` the hits (and the partial match after them) can give: at least
    /// the last prompt token is computed.
    pub(super) fn loadable(&self, prompt: &[u32]) -> usize {
        let whole = self.hits.len() * self.geom.block_tokens;
        let part = self.partial.as_ref().map_or(0, |p| p.2);
        (whole + part).min(prompt.len().saturating_sub(1))
    }

    /// The parent key of block `i` in the children index (a chain's root for the first).
    fn parent_of(&self, i: usize) -> BlockKey {
        i.checked_sub(1).map_or_else(|| self.seed.root(), |p| self.keys[p])
    }

    /// Sets what [`PrefixCache::load`] is planned to load (before the engine runs).
    pub(super) fn plan_report(&mut self, prompt: &[u32]) {
        let b = self.geom.block_tokens;
        let n = self.loadable(prompt);
        let whole = self.hits.len().min(n.div_ceil(b));
        self.report.used = self.keys[..whole].to_vec();
        self.report.partial_tokens = n.saturating_sub(self.hits.len() * b);
        if let (Some(p), true) = (&self.partial, self.report.partial_tokens > 0) {
            self.report.used.push(p.0);
        }
        self.report.reused_tokens = n;
        self.report.prompt_tokens = prompt.len();
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
        let mut partial = 0;
        if let Some((key, block, _)) = self.partial.take() {
            let take = n.saturating_sub(at);
            if at == self.hits.len() * b && take > 0 {
                if kv.append_block(&block.k, &block.v, b, take).is_ok() {
                    used.push(key);
                    at += take;
                    partial = take;
                }
            }
        }
        self.hits.clear();
        self.report.reused_tokens = at;
        self.report.partial_tokens = partial;
        self.report.used = used;
        at
    }

    /// Publishes the whole blocks among the positions `kv` holds (the prompt, then the
    /// generated tokens fed back) that are not resident yet, and the partial block at their end.
    fn publish(&mut self, kv: &KvCache, prompt: &[u32], generated: &[u32]) {
        let b = self.geom.block_tokens;
        let valid = kv.len().min(prompt.len() + generated.len());
        let whole = valid / b;
        if whole < self.published || (whole == self.published && valid % b == 0) {
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
            let block_tokens = &tokens[i * b..(i + 1) * b];
            self.memory.add_child(self.parent_of(i), Child { key, tokens: block_tokens.into() });
            let parent = (i > 0).then(|| self.keys[i - 1]);
            fresh.push(NewBlock { key, parent, position: i * b, tokens: block_tokens.to_vec(), block });
        }
        self.published = self.published.max(whole);
        // The tail: fewer tokens than a block, keyed like a block of those tokens.
        let tail = &tokens[whole * b..valid];
        if !tail.is_empty() && self.keys.len() >= whole {
            let parent = whole.checked_sub(1).map(|p| self.keys[p]);
            let key = self.seed.next(parent.as_ref(), tail);
            if self.tail != Some(key) && !self.memory.contains(&key) {
                if let Ok(block) = Block::from_cache_part(&self.geom, kv, whole * b, tail.len()) {
                    let block = Arc::new(block);
                    self.memory.insert(key, block.clone());
                    self.memory.add_child(self.parent_of(whole), Child { key, tokens: tail.into() });
                    fresh.push(NewBlock { key, parent, position: whole * b, tokens: tail.to_vec(), block });
                }
            }
            self.tail = Some(key);
        }
        self.report.new_blocks.extend(fresh);
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}
