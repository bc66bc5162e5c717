//! The workload builder: reuse of stored KV blocks, so the model runs only on the part of a
//! prompt it has not seen, also across restarts.
//!
//! * `keys` — a prompt's tokens in fixed blocks, each keyed by a SHA-256 chain over (tenant
//!   salt, model id, previous key, block tokens): stable across restarts, never shared by tenants
//! * `index` — [`Block`] (exact f16 K and V of one block) and the memory index (moka, byte
//!   budget, LRU)
//! * `codec` — the on-disk encodings (f16 lossless by default; q8_0 / q4_0 lossy) and checksums
//! * `disk` — the persistent tier: `kv_lineage` rows, bytes in a memory-mapped side file (or
//!   BLOBs), a byte budget with LRU eviction, corrupt blocks detected and dropped
//! * `blend` — BLEND: document chunks' KV under a key chain of their own, and the [`BlendPlan`]
//!   the engine blends from
//! * `shared` — the same tier on the PostgreSQL store (`--kv-storage blob`): blocks as `bytea`
//!   rows every replica on the database loads
//! * `plan` — [`KvPlan`], the engine's `PrefixCache` (load the prefix at admission, publish
//!   computed blocks), the only place block keys are derived, and the per-request [`ReportData`]
//!
//! Request path: the pipeline asks [`KvWorkload::prepare`] for the longest reusable prefix of
//! the prompt (memory first, then disk, promoting disk blocks into memory) and sends the plan
//! with the job; the scheduler starts the sequence's prefill after the loaded prefix and gives
//! the plan back with the finished result; after the answer is recorded, [`KvWorkload::finish`]
//! stores the new blocks and the request's reuse numbers (`kv_requests`). Because the forward pass is
//! bitwise batch invariant and f16 blocks are stored byte for byte, a greedy answer with reuse is
//! token for token the answer without it.

pub mod blend;
pub mod codec;
pub mod disk;
pub mod index;
pub mod keys;
pub mod plan;
pub mod shared;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub use blend::{chunk_tenant, BlendData, BlendPlan};
pub use codec::{Codec, CodecError};
pub use disk::{side_file_path, DiskTier, Storage};
pub use index::{Block, Child, Geometry, MemoryIndex};
pub use keys::{BlockKey, ChainSeed};
pub use plan::{KvPlan, ReportData};
pub use shared::SharedTier;

use crate::engine::LlamaConfig;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("KV store database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("KV side file: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("shared KV store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("KV store: {0}")]
    Invalid(String),
    #[error(
        "the index of the KV side file {} is damaged ({what}); nothing was changed. Start with --no-kv-reuse to serve \
         without stored KV blocks, or once with --kv-disk-mb 0 to drop them all (they are recomputed)",
        side.display()
    )]
    DamagedIndex { what: String, side: std::path::PathBuf },
}

/// BLEND's default recompute ratio (docs/perf.md, "BLEND": chosen from the SQuAD numbers).
pub const DEFAULT_BLEND_RECOMPUTE: f32 = 0.30;

/// How the service reuses KV blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct KvConfig {
    /// Bytes of blocks kept in memory.
    pub memory_bytes: u64,
    /// Bytes of blocks kept on disk (0: no persistent tier).
    pub disk_bytes: u64,
    /// Tokens per block.
    pub block_tokens: usize,
    /// How stored blocks are encoded (f16 lossless; q8_0 / q4_0 lossy).
    pub codec: Codec,
    /// Where stored bytes live: with SQLite a side file or BLOBs; with PostgreSQL `Blob` means
    /// `bytea` rows shared by every replica, `File` means no persistent tier (each replica's
    /// blocks stay in its memory).
    pub storage: Storage,
    /// BLEND: the fraction of document tokens recomputed in every layer (0 ..= 1).
    pub blend_recompute: f32,
}

impl Default for KvConfig {
    fn default() -> Self {
        KvConfig { memory_bytes: 512 << 20, disk_bytes: 2 << 30, block_tokens: 16, codec: Codec::F16, storage: Storage::File, blend_recompute: DEFAULT_BLEND_RECOMPUTE }
    }
}

/// The block index of one model: memory over a persistent tier. With the shared PostgreSQL
/// store the persistent tier is the database's `bytea` rows (`--kv-storage blob`: every replica
/// loads what any computed) or none (the default: each replica keeps its blocks in memory);
/// docs/schema.md, "PostgreSQL", says why and what each costs.
pub struct KvWorkload {
    geom: Geometry,
    model_id: String,
    memory: MemoryIndex,
    disk: Option<Persistent>,
}

/// The persistent tier under the memory index.
enum Persistent {
    /// Beside a SQLite store: side file or BLOBs, this process only.
    Local(DiskTier),
    /// In the PostgreSQL store, shared by replicas.
    Shared(SharedTier),
}

impl Persistent {
    fn load(&self, keys: &[BlockKey]) -> Result<(Vec<Arc<Block>>, usize), WorkloadError> {
        match self {
            Persistent::Local(d) => d.load(keys),
            Persistent::Shared(s) => s.load(keys),
        }
    }

    fn children(&self, tenant: &str, model_id: &str, parent: Option<&BlockKey>) -> Result<Vec<Child>, WorkloadError> {
        match self {
            Persistent::Local(d) => d.children(tenant, model_id, parent),
            Persistent::Shared(s) => s.children(tenant, model_id, parent),
        }
    }

    fn record(&self, r: &disk::Record<'_>) -> Result<usize, WorkloadError> {
        match self {
            Persistent::Local(d) => d.record(r),
            Persistent::Shared(s) => s.record(r),
        }
    }

    fn usage(&self) -> (u64, u64) {
        match self {
            Persistent::Local(d) => d.usage(),
            Persistent::Shared(s) => s.usage(),
        }
    }
}

impl KvWorkload {
    /// Opens the tiers for a model (`model_id`: sha256 of its file) over the service's store:
    /// beside a SQLite store the disk tier; on PostgreSQL the shared tier when the storage is
    /// `Blob`, else none.
    pub fn open(config: &KvConfig, store: &Store, model: &LlamaConfig, model_id: &str) -> Result<KvWorkload, WorkloadError> {
        let geom = Geometry::new(model, config.block_tokens);
        let disk = match store {
            Store::Sqlite(s) => Some(Persistent::Local(DiskTier::open(s.clone(), geom, config.codec, config.storage, config.disk_bytes)?)),
            Store::Postgres(pg) if config.storage == Storage::Blob => Some(Persistent::Shared(SharedTier::open(pg, geom, config.codec, config.disk_bytes)?)),
            Store::Postgres(_) => None,
        };
        Ok(KvWorkload { geom, model_id: model_id.to_string(), memory: MemoryIndex::new(config.memory_bytes), disk })
    }

    pub fn geometry(&self) -> Geometry {
        self.geom
    }

    /// The key chain of a tenant on this model.
    pub fn seed(&self, tenant: &str) -> ChainSeed {
        ChainSeed::new(tenant, &self.model_id, self.geom.block_tokens)
    }

    /// The longest reusable prefix of `prompt` for `tenant`: resident blocks first, then stored
    /// ones (read, checked, promoted into memory). Blocking (disk).
    pub fn prepare(&self, tenant: &str, prompt: &[u32]) -> KvPlan {
        let t0 = Instant::now();
        let mut plan = KvPlan {
            geom: self.geom,
            seed: self.seed(tenant),
            published: 0,
            keys: Vec::new(),
            hits: Vec::new(),
            partial: None,
            tail: None,
            memory: self.memory.clone(),
            report: ReportData::default(),
        };
        plan.extend_keys(prompt);
        let keys = &plan.keys;
        let b = self.geom.block_tokens;
        // Only blocks that can be loaded matter: at least the last prompt token is computed.
        let usable = prompt.len().saturating_sub(1).div_ceil(b).min(keys.len());
        let mut hits: Vec<Arc<Block>> = keys[..usable].iter().map_while(|k| self.memory.get(k)).collect();
        let from_memory = hits.len();
        let mut corrupt = 0;
        if let (true, Some(disk)) = (hits.len() < usable, &self.disk) {
            match disk.load(&keys[hits.len()..usable]) {
                Ok((blocks, bad)) => {
                    for (i, block) in (hits.len()..).zip(&blocks) {
                        self.memory.insert(keys[i], block.clone());
                        let parent = i.checked_sub(1).map_or_else(|| plan.seed.root(), |p| keys[p]);
                        self.memory.add_child(parent, Child { key: keys[i], tokens: prompt[i * b..(i + 1) * b].into() });
                    }
                    hits.extend(blocks);
                    corrupt = bad;
                }
                Err(e) => tracing::warn!(error = %e, "reading stored KV blocks failed; computing them"),
            }
        }
        let at = hits.len() * b;
        let limit = prompt.len().saturating_sub(1);
        if at < limit {
            let parent = hits.len().checked_sub(1).map(|i| keys[i]);
            plan.partial = self.partial_match(tenant, &plan.seed, parent, &prompt[at..limit.min(at + b)]);
        }
        plan.published = hits.len();
        plan.report = ReportData { prompt_blocks: keys.len(), blocks_memory: from_memory, blocks_disk: hits.len() - from_memory, blocks_corrupt: corrupt, ..ReportData::default() };
        plan.hits = hits;
        plan.plan_report(prompt);
        plan.report.load_ms = t0.elapsed().as_secs_f64() * 1e3;
        plan
    }

    /// The stored block after `parent` (`None`: a chain's first) that shares the most leading
    /// tokens with `next` (the prompt's tokens after the matched whole blocks), memory first,
    /// then disk; with how many it shares. `None` when none shares a token.
    fn partial_match(&self, tenant: &str, seed: &ChainSeed, parent: Option<BlockKey>, next: &[u32]) -> Option<(BlockKey, Arc<Block>, usize)> {
        let shared = |c: &Child| c.tokens.iter().zip(next).take_while(|(a, b)| a == b).count();
        let root = parent.unwrap_or_else(|| seed.root());
        let mut found: Vec<(usize, Child)> = self.memory.children(&root).into_iter().map(|c| (shared(&c), c)).filter(|(n, _)| *n > 0).collect();
        let best = found.iter().map(|(n, _)| *n).max().unwrap_or(0);
        if let (true, Some(disk)) = (best < next.len(), &self.disk) {
            // Disk may hold a longer match (e.g. after a restart).
            match disk.children(tenant, &self.model_id, parent.as_ref()) {
                Ok(rows) => {
                    for c in rows {
                        let n = shared(&c);
                        if n > best && !found.iter().any(|(_, f)| f.key == c.key) {
                            found.push((n, c));
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "looking up stored KV blocks failed"),
            }
        }
        found.sort_by(|a, b| b.0.cmp(&a.0));
        for (n, c) in found {
            let block = self.memory.get(&c.key).or_else(|| {
                let (mut blocks, _) = self.disk.as_ref()?.load(&[c.key]).ok()?;
                let block = blocks.pop()?;
                self.memory.insert(c.key, block.clone());
                self.memory.add_child(root, c.clone());
                Some(block)
            });
            if let Some(block) = block {
                return Some((c.key, block, n));
            }
        }
        None
    }

    /// After the request was recorded as `inference_id`: stores the blocks it computed (disk
    /// budget permitting), touches the ones it reused, records its numbers in `kv_requests` and
    /// the reused prefix in `semantic_fragments` (`decode` turns tokens into its text).
    pub fn finish(
        &self,
        tenant: &str,
        report: &ReportData,
        inference_id: i64,
        prompt: &[u32],
        decode: impl FnOnce(&[u32]) -> Option<String>,
    ) -> Result<usize, WorkloadError> {
        let r = report;
        let b = self.geom.block_tokens;
        let whole = r.reused_tokens / b;
        let fragment = match whole.checked_sub(1).and_then(|i| r.used.get(i)) {
            Some(key) => decode(&prompt[..whole * b]).map(|text| (*key, whole * b, text)),
            None => None,
        };
        let Some(disk) = &self.disk else {
            // No persistent tier (PostgreSQL, blocks per replica): nothing is stored or recorded.
            return Ok(0);
        };
        let stored = disk.record(&disk::Record {
            tenant,
            model_id: &self.model_id,
            inference_id,
            used: &r.used,
            new_blocks: &r.new_blocks,
            prompt_blocks: r.prompt_blocks,
            blocks_memory: r.blocks_memory,
            blocks_disk: r.blocks_disk,
            blocks_corrupt: r.blocks_corrupt,
            kv_tokens_reused: r.reused_tokens,
            partial_tokens: r.partial_tokens,
            prompt_tokens: r.prompt_tokens,
            blend_tokens_reused: 0,
            blend_tokens_recomputed: 0,
            load_ms: r.load_ms,
            memory_bytes: self.memory.usage().0,
            fragment,
        })?;
        Ok(stored)
    }

    /// After a BLEND request was recorded as `inference_id`: its numbers in `kv_requests`. The
    /// chunks' blocks stay in the memory tier (a chunk's KV is recomputed after a restart).
    pub fn finish_blend(&self, tenant: &str, data: &BlendData, inference_id: i64, prompt_tokens: usize) -> Result<(), WorkloadError> {
        let Some(disk) = &self.disk else { return Ok(()) };
        let e = &data.engine;
        disk.record(&disk::Record {
            tenant,
            model_id: &self.model_id,
            inference_id,
            used: &[],
            new_blocks: &[],
            prompt_blocks: 0,
            blocks_memory: 0,
            blocks_disk: 0,
            blocks_corrupt: 0,
            kv_tokens_reused: e.reused,
            partial_tokens: 0,
            prompt_tokens,
            blend_tokens_reused: e.reused,
            blend_tokens_recomputed: e.recomputed,
            load_ms: 0.0,
            memory_bytes: self.memory.usage().0,
            fragment: None,
        })?;
        Ok(())
    }

    /// (bytes, blocks) in memory and on disk.
    pub fn usage(&self) -> ((u64, u64), (u64, u64)) {
        (self.memory.usage(), self.disk.as_ref().map_or((0, 0), |d| d.usage()))
    }

    /// The local disk tier (beside a SQLite store).
    pub fn disk(&self) -> Option<&DiskTier> {
        match &self.disk {
            Some(Persistent::Local(d)) => Some(d),
            _ => None,
        }
    }

    /// The shared tier (PostgreSQL, `--kv-storage blob`).
    pub fn shared(&self) -> Option<&SharedTier> {
        match &self.disk {
            Some(Persistent::Shared(s)) => Some(s),
            _ => None,
        }
    }

    /// The side file of blocks, when the storage is `file`.
    pub fn side_file(&self) -> Option<PathBuf> {
        self.disk().and_then(|d| d.side_file())
    }
}
