//! The shared persistent tier (`serve --db postgres://... --kv-storage blob`): KV blocks as
//! `bytea` rows of the PostgreSQL store (`kv_lineage` + `kv_block_data`), so a replica loads
//! the blocks any replica on the same database computed instead of recomputing them. The same
//! operations as the SQLite [`super::DiskTier`] (load in key order up to the first miss, the
//! children of a parent for partial matches, record a finished request in one transaction),
//! the same codec and checksum, the same rows; what differs:
//!
//! * its own connection (a second [`PgStore`] on the same URL): a prefix is ~23 MB of bytes per
//!   1,000 SmolLM2 tokens, which must not queue behind (or hold up) the store's request writes;
//! * writers are serialized across replicas by a transaction advisory lock, so the shared
//!   budget (`--kv-disk-mb`, for the whole table) and the block-key uniqueness hold with any
//!   number of replicas: a block two replicas computed at once is stored once;
//! * rows of another codec or block size (another replica's configuration) are left alone and
//!   never loaded;
//! * the budget is counted in the database (other replicas add rows), not in memory.
//!
//! A lost database makes loads fail (the request computes its prefix, as with no tier) and
//! records fail (logged; the answer is already recorded by then).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::codec::{checksum, Codec};
use super::disk::Record;
use super::index::{Block, Child, Geometry};
use super::keys::{key_from_hex, key_hex, BlockKey};
use super::WorkloadError;
use crate::store::{PgStore, StoreError};

/// Key of the transaction advisory lock every KV write takes (ASCII "forgekv").
const KV_LOCK: i64 = 0x0066_6f72_6765_6b76;

/// KV blocks shared by every replica on one PostgreSQL database.
pub struct SharedTier {
    pg: PgStore,
    geom: Geometry,
    codec: Codec,
    block_bytes: usize,
    max_blocks: u64,
    /// Rows in the table when this replica last looked (all replicas' blocks).
    resident: AtomicU64,
}

impl SharedTier {
    /// Opens a second connection to `store`'s database; `budget_bytes` bounds the whole table.
    pub fn open(store: &PgStore, geom: Geometry, codec: Codec, budget_bytes: u64) -> Result<SharedTier, WorkloadError> {
        let block_bytes = codec.block_bytes(&geom);
        let pg = store.another_connection()?;
        let tier = SharedTier { pg, geom, codec, block_bytes, max_blocks: budget_bytes / block_bytes as u64, resident: AtomicU64::new(0) };
        let n = tier.pg.with(|c| Ok(c.query_one("SELECT COUNT(*) FROM kv_lineage", &[])?.try_get::<_, i64>(0)?))?;
        tier.resident.store(n.max(0) as u64, Ordering::Relaxed);
        Ok(tier)
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Bytes of one stored block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Stored bytes and blocks (every replica's), as last seen.
    pub fn usage(&self) -> (u64, u64) {
        let n = self.resident.load(Ordering::Relaxed);
        (n * self.block_bytes as u64, n)
    }

    /// The stored blocks of `keys`, in order, up to the first one missing or damaged (one
    /// round trip); and how many damaged blocks were found (deleted, so they are recomputed).
    pub fn load(&self, keys: &[BlockKey]) -> Result<(Vec<Arc<Block>>, usize), WorkloadError> {
        if keys.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let hex: Vec<String> = keys.iter().map(key_hex).collect();
        let rows = self.pg.with(|c| {
            Ok(c.query(
                "SELECT l.block_key, l.id, l.checksum, d.data FROM kv_lineage l JOIN kv_block_data d ON d.lineage_id = l.id
                 WHERE l.block_key = ANY($1) AND l.storage = 'blob' AND l.codec = $2 AND l.size_bytes = $3",
                &[&hex, &self.codec.as_str(), &(self.block_bytes as i64)],
            )?)
        })?;
        let mut found: HashMap<String, (i64, i64, Vec<u8>)> = HashMap::with_capacity(rows.len());
        for r in rows {
            found.insert(r.try_get(0).map_err(StoreError::from)?, (r.try_get(1).map_err(StoreError::from)?, r.try_get(2).map_err(StoreError::from)?, r.try_get(3).map_err(StoreError::from)?));
        }
        let mut out = Vec::new();
        for (key, h) in keys.iter().zip(&hex) {
            let Some((id, sum, bytes)) = found.remove(h) else { break };
            let block = (checksum(&bytes) == sum).then(|| self.codec.decode(&self.geom, &bytes).ok()).flatten();
            match block {
                Some(b) => out.push(Arc::new(b)),
                None => {
                    tracing::warn!(block = &key_hex(key)[..16], "shared KV block failed its checksum; deleted, it will be recomputed");
                    self.pg.with(|c| Ok(c.execute("DELETE FROM kv_lineage WHERE id = $1", &[&id])?))?;
                    return Ok((out, 1));
                }
            }
        }
        Ok((out, 0))
    }

    /// The stored blocks after `parent` (`None`: the first blocks of `tenant` on `model_id`),
    /// with their tokens, most recently used first.
    pub fn children(&self, tenant: &str, model_id: &str, parent: Option<&BlockKey>) -> Result<Vec<Child>, WorkloadError> {
        let filter = "tenant = $1 AND model_id = $2 AND token_count <= $3 AND storage = 'blob' AND codec = $4 AND size_bytes = $5";
        let (bt, codec, size) = (self.geom.block_tokens as i64, self.codec.as_str(), self.block_bytes as i64);
        let rows = self.pg.with(|c| {
            Ok(match parent {
                Some(p) => c.query(
                    &format!("SELECT block_key, tokens FROM kv_lineage WHERE parent_key = $6 AND {filter} ORDER BY last_used_at DESC LIMIT 64"),
                    &[&tenant, &model_id, &bt, &codec, &size, &key_hex(p)],
                )?,
                None => c.query(
                    &format!("SELECT block_key, tokens FROM kv_lineage WHERE parent_key IS NULL AND {filter} ORDER BY last_used_at DESC LIMIT 64"),
                    &[&tenant, &model_id, &bt, &codec, &size],
                )?,
            })
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (key, tokens): (String, String) = (r.try_get(0).map_err(StoreError::from)?, r.try_get(1).map_err(StoreError::from)?);
            // A row that does not parse is skipped (its block is never served).
            if let (Some(key), Ok(tokens)) = (key_from_hex(&key), serde_json::from_str::<Vec<u32>>(&tokens)) {
                out.push(Child { key, tokens: tokens.into() });
            }
        }
        Ok(out)
    }

    /// Stores what a finished request computed and reused, in one transaction: touches the
    /// reused rows, inserts the new blocks not stored yet (by any replica), evicting the least
    /// recently used rows past the budget, and records the request's numbers.
    pub fn record(&self, r: &Record<'_>) -> Result<usize, WorkloadError> {
        let t0 = std::time::Instant::now();
        let encoded: Vec<Vec<u8>> = r.new_blocks.iter().map(|b| self.codec.encode(&self.geom, &b.block)).collect();
        let tokens: Vec<String> =
            r.new_blocks.iter().map(|b| serde_json::to_string(&b.tokens)).collect::<Result<_, _>>().map_err(|e| WorkloadError::Invalid(e.to_string()))?;
        let (stored, resident) = self.pg.tx(|tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&KV_LOCK])?;
            let used: Vec<String> = r.used.iter().map(key_hex).collect();
            tx.execute("UPDATE kv_lineage SET last_used_at = forge_now(), reuse_count = reuse_count + 1 WHERE block_key = ANY($1)", &[&used])?;
            let mut resident = tx.query_one("SELECT COUNT(*) FROM kv_lineage", &[])?.try_get::<_, i64>(0)?.max(0) as u64;
            let mut ours: Vec<i64> = Vec::new();
            let mut stored = 0usize;
            for ((b, bytes), tokens) in r.new_blocks.iter().zip(&encoded).zip(&tokens) {
                let hex = key_hex(&b.key);
                if tx.execute("UPDATE kv_lineage SET last_used_at = forge_now() WHERE block_key = $1", &[&hex])? > 0 {
                    continue; // stored already (by this replica or another)
                }
                if self.max_blocks == 0 {
                    break;
                }
                if resident >= self.max_blocks {
                    let evicted = tx.query_opt(
                        "DELETE FROM kv_lineage WHERE id = (SELECT id FROM kv_lineage WHERE NOT (id = ANY($1))
                             ORDER BY last_used_at, position DESC, id LIMIT 1) RETURNING id",
                        &[&ours],
                    )?;
                    if evicted.is_none() {
                        break; // everything stored is this request's own: the budget is full
                    }
                    resident -= 1;
                }
                let id: i64 = tx
                    .query_one(
                        "INSERT INTO kv_lineage (tenant, model_id, block_key, parent_key, position, token_count, tokens, inference_id,
                             codec, size_bytes, checksum, storage, slot)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'blob', NULL) RETURNING id",
                        &[
                            &r.tenant,
                            &r.model_id,
                            &hex,
                            &b.parent.as_ref().map(key_hex),
                            &(b.position as i64),
                            &(b.tokens.len() as i64),
                            tokens,
                            &r.inference_id,
                            &self.codec.as_str(),
                            &(bytes.len() as i64),
                            &checksum(bytes),
                        ],
                    )?
                    .try_get(0)?;
                tx.execute("INSERT INTO kv_block_data (lineage_id, data) VALUES ($1, $2)", &[&id, bytes])?;
                ours.push(id);
                resident += 1;
                stored += 1;
            }
            let n = |v: usize| v as i64;
            tx.execute(
                "INSERT INTO kv_requests (inference_id, tenant, prompt_blocks, blocks_memory, blocks_disk, blocks_corrupt, blocks_stored,
                     kv_tokens_reused, load_ms, store_ms, memory_bytes, disk_bytes, partial_tokens, prompt_tokens)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                &[
                    &r.inference_id,
                    &r.tenant,
                    &n(r.prompt_blocks),
                    &n(r.blocks_memory),
                    &n(r.blocks_disk),
                    &n(r.blocks_corrupt),
                    &n(stored),
                    &n(r.kv_tokens_reused),
                    &r.load_ms,
                    &(t0.elapsed().as_secs_f64() * 1e3),
                    &(r.memory_bytes as i64),
                    &((resident * self.block_bytes as u64) as i64),
                    &n(r.partial_tokens),
                    &n(r.prompt_tokens),
                ],
            )?;
            if let Some((key, count, text)) = &r.fragment {
                tx.execute(
                    "INSERT INTO semantic_fragments (tenant, inference_id, text, kind, kv_block_key, token_count, reuse_count, last_reused_at)
                     VALUES ($1, $2, $3, 'kv_prefix', $4, $5, 1, forge_now())
                     ON CONFLICT (tenant, kv_block_key) WHERE kv_block_key IS NOT NULL
                     DO UPDATE SET reuse_count = semantic_fragments.reuse_count + 1, last_reused_at = forge_now()",
                    &[&r.tenant, &r.inference_id, text, &key_hex(key), &(*count as i64)],
                )?;
            }
            Ok((stored, resident))
        })?;
        self.resident.store(resident, Ordering::Relaxed);
        Ok(stored)
    }
}
