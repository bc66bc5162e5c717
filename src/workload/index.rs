//! KV blocks in memory: [`Block`] (the f16 keys and values of `block_tokens` positions of every
//! layer and KV head, exactly as the engine computed them) and [`MemoryIndex`], the resident
//! blocks by key under a byte budget with LRU eviction (moka, weighed by bytes).
//!
//! Keys chain (see [`super::keys`]), so the index needs no tree: the longest resident prefix
//! of a prompt is its first keys looked up in order until the first miss.

use std::sync::Arc;

use half::f16;

use super::keys::BlockKey;
use crate::engine::{KvCache, LlamaConfig};

/// The shape of a block for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// `n_layer * n_head_kv`: one row of positions per (layer, KV head).
    pub rows: usize,
    pub head_dim: usize,
    pub block_tokens: usize,
}

impl Geometry {
    pub fn new(c: &LlamaConfig, block_tokens: usize) -> Geometry {
        Geometry { rows: c.n_layer * c.n_head_kv, head_dim: c.head_dim, block_tokens: block_tokens.max(1) }
    }

    /// f16 values of K (or of V) in one block.
    pub fn values(&self) -> usize {
        self.rows * self.block_tokens * self.head_dim
    }

    /// Bytes of K and V together, in f16.
    pub fn bytes(&self) -> usize {
        self.values() * 2 * 2
    }
}

/// Keys and values of one block, [rows, block_tokens, head_dim] each.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub k: Vec<f16>,
    pub v: Vec<f16>,
}

impl Block {
    /// Positions `start..start + block_tokens` of `kv`.
    pub fn from_cache(g: &Geometry, kv: &KvCache, start: usize) -> Result<Block, String> {
        let mut b = Block { k: vec![f16::ZERO; g.values()], v: vec![f16::ZERO; g.values()] };
        kv.read_range(start, g.block_tokens, &mut b.k, &mut b.v)?;
        Ok(b)
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }
}

/// Resident blocks under a byte budget, least recently used evicted first. Cheap to clone
/// (shared).
#[derive(Clone)]
pub struct MemoryIndex {
    cache: moka::sync::Cache<BlockKey, Arc<Block>>,
}

impl MemoryIndex {
    pub fn new(budget_bytes: u64) -> MemoryIndex {
        let cache = moka::sync::Cache::builder()
            .max_capacity(budget_bytes)
            .weigher(|_k: &BlockKey, b: &Arc<Block>| u32::try_from(b.bytes()).unwrap_or(u32::MAX))
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build();
        MemoryIndex { cache }
    }

    pub fn get(&self, key: &BlockKey) -> Option<Arc<Block>> {
        self.cache.get(key)
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.cache.contains_key(key)
    }

    pub fn insert(&self, key: BlockKey, block: Arc<Block>) {
        self.cache.insert(key, block);
    }

    /// Resident bytes and blocks (after pending evictions are applied).
    pub fn usage(&self) -> (u64, u64) {
        self.cache.run_pending_tasks();
        (self.cache.weighted_size(), self.cache.entry_count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(fill: f32, g: &Geometry) -> Arc<Block> {
        Arc::new(Block { k: vec![f16::from_f32(fill); g.values()], v: vec![f16::from_f32(-fill); g.values()] })
    }

    #[test]
    fn eviction_keeps_the_index_under_its_budget_least_recent_first() {
        let g = Geometry { rows: 4, head_dim: 8, block_tokens: 4 };
        let per = g.bytes() as u64; // 512 bytes
        let idx = MemoryIndex::new(per * 3);
        for i in 0..3u8 {
            idx.insert([i; 32], block(f32::from(i), &g));
        }
        assert_eq!(idx.usage(), (per * 3, 3));
        // Touch block 0, then add two more: 1 and 2 were used least recently and go.
        assert!(idx.get(&[0; 32]).is_some());
        idx.usage();
        idx.insert([3; 32], block(3.0, &g));
        idx.insert([4; 32], block(4.0, &g));
        let (bytes, n) = idx.usage();
        assert!(bytes <= per * 3 && n == 3, "{bytes} bytes in {n} blocks");
        assert!(idx.contains(&[0; 32]) && idx.contains(&[3; 32]) && idx.contains(&[4; 32]));
        assert!(!idx.contains(&[1; 32]) && !idx.contains(&[2; 32]));
        // A block larger than the whole budget is not kept.
        let tiny = MemoryIndex::new(per - 1);
        tiny.insert([9; 32], block(1.0, &g));
        assert_eq!(tiny.usage(), (0, 0));
    }
}
