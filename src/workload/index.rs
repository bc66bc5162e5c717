//! KV blocks in memory: [`Block`] (the f16 keys and values of `block_tokens` positions of every
//! layer and KV head, exactly as the engine computed them) and [`MemoryIndex`], the resident
//! blocks by key under a byte budget with LRU eviction (moka, weighed by bytes).
//!
//! Keys chain (see [`super::keys`]), so the index needs no tree: the longest resident prefix
//! of a prompt is its first keys looked up in order until the first miss. Where a prompt
//! diverges inside a block, the blocks stored after the same parent ([`MemoryIndex::children`])
//! give the leading tokens they share with it; a sequence's last, partial block is stored as a
//! block of fewer tokens (its unused positions zero).

use std::sync::Arc;

use half::f16;

use super::keys::BlockKey;
use crate::engine::{KvCache, LlamaConfig};

/// The shape of a block for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// `n_layer * n_head_kv`: one row of positions per (layer, KV head).
    pub rows: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Token positions per block.
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
    /// [rows, block_tokens, head_dim] keys
    pub k: Vec<f16>,
    /// [rows, block_tokens, head_dim] values
    pub v: Vec<f16>,
}

impl Block {
    /// Positions `start..start + block_tokens` of `kv`.
    pub fn from_cache(g: &Geometry, kv: &KvCache, start: usize) -> Result<Block, String> {
        let mut b = Block { k: vec![f16::ZERO; g.values()], v: vec![f16::ZERO; g.values()] };
        kv.read_range(start, g.block_tokens, &mut b.k, &mut b.v)?;
        Ok(b)
    }

    /// Positions `start..start + n` of `kv` (`n` < `block_tokens`: a sequence's tail) in a
    /// block's layout, the positions after `n` zero.
    pub fn from_cache_part(g: &Geometry, kv: &KvCache, start: usize, n: usize) -> Result<Block, String> {
        let (b, hd) = (g.block_tokens, g.head_dim);
        if n >= b {
            return Block::from_cache(g, kv, start);
        }
        let mut k = vec![f16::ZERO; g.rows * n * hd];
        let mut v = k.clone();
        kv.read_range(start, n, &mut k, &mut v)?;
        let mut out = Block { k: vec![f16::ZERO; g.values()], v: vec![f16::ZERO; g.values()] };
        for r in 0..g.rows {
            out.k[r * b * hd..(r * b + n) * hd].copy_from_slice(&k[r * n * hd..(r + 1) * n * hd]);
            out.v[r * b * hd..(r * b + n) * hd].copy_from_slice(&v[r * n * hd..(r + 1) * n * hd]);
        }
        Ok(out)
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }
}

/// A block stored after a parent: its key and tokens (fewer than a block for a tail).
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// The child block's key.
    pub key: BlockKey,
    /// Its token ids.
    pub tokens: Arc<[u32]>,
}

/// Children remembered per parent (the most recent ones).
const MAX_CHILDREN: usize = 64;

/// Resident blocks under a byte budget, least recently used evicted first, and which blocks
/// followed which parent. Cheap to clone (shared).
#[derive(Clone)]
pub struct MemoryIndex {
    cache: moka::sync::Cache<BlockKey, Arc<Block>>,
    /// Parent key (or a chain's root) → blocks published after it. A child may have been
    /// evicted from `cache` since (then it is looked up on disk).
    children: moka::sync::Cache<BlockKey, Arc<Vec<Child>>>,
}

impl MemoryIndex {
    pub fn new(budget_bytes: u64) -> MemoryIndex {
        let cache = moka::sync::Cache::builder()
            .max_capacity(budget_bytes)
            .weigher(|_k: &BlockKey, b: &Arc<Block>| u32::try_from(b.bytes()).unwrap_or(u32::MAX))
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build();
        // Entries are small (keys and up to a block of token ids each): bounded by count.
        let children = moka::sync::Cache::builder().max_capacity(1 << 18).build();
        MemoryIndex { cache, children }
    }

    /// Remembers that `child` was published after `parent`.
    pub fn add_child(&self, parent: BlockKey, child: Child) {
        let mut list = self.children.get(&parent).map(|l| (*l).clone()).unwrap_or_default();
        if list.iter().any(|c| c.key == child.key) {
            return;
        }
        if list.len() >= MAX_CHILDREN {
            list.remove(0);
        }
        list.push(child);
        self.children.insert(parent, Arc::new(list));
    }

    /// The blocks published after `parent`.
    pub fn children(&self, parent: &BlockKey) -> Vec<Child> {
        self.children.get(parent).map(|l| (*l).clone()).unwrap_or_default()
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

    #[test]
    fn children_are_remembered_per_parent_without_duplicates() {
        let idx = MemoryIndex::new(1 << 20);
        let child = |i: u8, t: &[u32]| Child { key: [i; 32], tokens: t.into() };
        idx.add_child([0; 32], child(1, &[1, 2, 3]));
        idx.add_child([0; 32], child(2, &[1, 2]));
        idx.add_child([0; 32], child(1, &[1, 2, 3]));
        idx.add_child([7; 32], child(3, &[9]));
        assert_eq!(idx.children(&[0; 32]), vec![child(1, &[1, 2, 3]), child(2, &[1, 2])]);
        assert_eq!(idx.children(&[7; 32]), vec![child(3, &[9])]);
        assert!(idx.children(&[5; 32]).is_empty());
    }
}
