//! The persistent tier: blocks encoded by a [`Codec`], checksummed, described by `kv_lineage`
//! rows in the service's SQLite file, their bytes either in a memory-mapped side file of
//! fixed-size slots (`<db>.kv`, the default) or in BLOBs (`kv_block_data`). The tier never
//! holds more than `budget / block bytes` blocks: storing one more evicts the least recently
//! used row first (and reuses its slot). A block whose bytes do not match its checksum is
//! deleted and reported, never returned.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use memmap2::Mmap;
use rusqlite::{params, Connection, OptionalExtension, Transaction};

use super::codec::{checksum, Codec};
use super::index::{Block, Child, Geometry};
use super::keys::{key_from_hex, key_hex, BlockKey};
use super::WorkloadError;
use crate::store::{now_sql, SqliteStore};

/// Where block bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// Fixed-size slots in `<db>.kv`, read through a memory map.
    #[default]
    File,
    /// One BLOB per block in `kv_block_data`.
    Blob,
}

impl Storage {
    pub fn as_str(self) -> &'static str {
        match self {
            Storage::File => "file",
            Storage::Blob => "blob",
        }
    }
}

/// A block computed by a request, to be stored.
#[derive(Debug, Clone)]
pub struct NewBlock {
    /// Chain key of the block (names the whole prefix up to its end).
    pub key: BlockKey,
    /// Key of the block before it (`None`: the first block).
    pub parent: Option<BlockKey>,
    /// Position of its first token.
    pub position: usize,
    /// Its token ids (block_tokens of them, fewer for a tail).
    pub tokens: Vec<u32>,
    /// Its keys and values.
    pub block: Arc<Block>,
}

/// What a finished request leaves in the store (one transaction).
pub struct Record<'a> {
    /// The tenant the request ran for.
    pub tenant: &'a str,
    /// sha256 of the model file.
    pub model_id: &'a str,
    /// The request's row in `inferences`.
    pub inference_id: i64,
    /// Keys of the blocks it reused (their rows are touched: LRU, reuse_count).
    pub used: &'a [BlockKey],
    /// Blocks it computed that are to be stored.
    pub new_blocks: &'a [NewBlock],
    /// Whole blocks of the prompt.
    pub prompt_blocks: usize,
    /// Blocks of the reused prefix found in memory.
    pub blocks_memory: usize,
    /// Blocks of the reused prefix read from disk.
    pub blocks_disk: usize,
    /// Stored blocks that failed their checksum (recomputed instead).
    pub blocks_corrupt: usize,
    /// Prompt positions whose KV was loaded instead of computed.
    pub kv_tokens_reused: usize,
    /// Of those, the leading tokens of a block the prompt diverges inside (or of a stored tail).
    pub partial_tokens: usize,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// BLEND: document tokens that kept KV computed elsewhere, and those recomputed.
    pub blend_tokens_reused: usize,
    /// (see `blend_tokens_reused`)
    pub blend_tokens_recomputed: usize,
    /// Time to find (and read) the prefix, ms.
    pub load_ms: f64,
    /// Resident bytes of the memory tier after the request.
    pub memory_bytes: u64,
    /// The recurring prompt part it reused: (key of its last block, tokens, text).
    pub fragment: Option<(BlockKey, usize, String)>,
}

pub struct DiskTier {
    inner: Mutex<Disk>,
    geom: Geometry,
    codec: Codec,
    storage: Storage,
    block_bytes: usize,
    max_blocks: u64,
}

struct Disk {
    /// Rows go through the store's own connection: one writer, so the store's transactions
    /// never meet a lock held by this tier.
    store: Arc<SqliteStore>,
    side: Option<SideFile>,
    resident: u64,
}

struct SideFile {
    path: PathBuf,
    file: File,
    map: Option<Mmap>,
    /// File length in slots.
    slots: u64,
    free: Vec<u64>,
    next: u64,
}

/// Maps `file` read-only.
fn map_file(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is only read while the tier's mutex is held, and this process changes the
    // file's length only under that mutex after dropping the map. Another process writing the
    // file could change bytes under us (every read is checked against its checksum before use)
    // or truncate it (a fault); one service per database is the supported setup (docs/schema.md).
    unsafe { Mmap::map(file) }
}

impl SideFile {
    fn bytes(&self, slot: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(slot).ok()?.checked_mul(len)?;
        self.map.as_ref()?.get(start..start + len)
    }

    fn write(&mut self, slot: u64, bytes: &[u8], max: u64) -> std::io::Result<()> {
        let len = bytes.len() as u64;
        if slot >= self.slots {
            self.map = None;
            self.slots = (slot + 1).max(self.slots + 16).min(max);
            self.file.set_len(self.slots * len)?;
            self.map = Some(map_file(&self.file)?);
        }
        self.file.seek(SeekFrom::Start(slot * len))?;
        self.file.write_all(bytes)
    }
}

impl DiskTier {
    /// Opens the tier of the database at `db` (already migrated by the store). Rows this
    /// configuration cannot use (another storage or codec, another block size) are dropped,
    /// then the least recently used ones until the budget holds.
    pub fn open(store: Arc<SqliteStore>, geom: Geometry, codec: Codec, storage: Storage, budget_bytes: u64) -> Result<DiskTier, WorkloadError> {
        let block_bytes = codec.block_bytes(&geom);
        let max_blocks = budget_bytes / block_bytes as u64;
        let db = store.path().to_path_buf();
        if max_blocks > 0 {
            // Before any change (with no budget every row goes: nothing to trust).
            check_index(&store.conn(), &side_file_path(&db))?;
        }
        store.conn().execute(
            "DELETE FROM kv_lineage WHERE storage != ?1 OR codec != ?2 OR size_bytes != ?3 OR (?1 = 'file' AND slot IS NULL)",
            params![storage.as_str(), codec.as_str(), block_bytes as i64],
        )?;
        let mut disk = Disk { store, side: None, resident: 0 };
        disk.resident = disk.count()?;
        while disk.resident > max_blocks {
            if !disk.evict_one(&[])? {
                break;
            }
        }
        if storage == Storage::File {
            let path = side_file_path(&db);
            let conn = disk.store.conn();
            let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
            compact(&conn, &mut file, block_bytes, max_blocks)?;
            let used: Vec<u64> = {
                let mut st = conn.prepare("SELECT slot FROM kv_lineage WHERE slot IS NOT NULL ORDER BY slot")?;
                let rows = st.query_map([], |r| r.get::<_, i64>(0))?;
                rows.map(|r| r.map(|s| s.max(0) as u64)).collect::<Result<_, _>>()?
            };
            let next = used.last().map_or(0, |s| s + 1);
            file.set_len(next * block_bytes as u64)?;
            let free = (0..next).filter(|s| used.binary_search(s).is_err()).rev().collect();
            let map = if next > 0 { Some(map_file(&file)?) } else { None };
            drop(conn);
            disk.side = Some(SideFile { path, file, map, slots: next, free, next });
        }
        Ok(DiskTier { inner: Mutex::new(disk), geom, codec, storage, block_bytes, max_blocks })
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn storage(&self) -> Storage {
        self.storage
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Bytes of one stored block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The side file, when blocks live in one.
    pub fn side_file(&self) -> Option<PathBuf> {
        self.lock().side.as_ref().map(|s| s.path.clone())
    }

    /// Stored bytes and blocks.
    pub fn usage(&self) -> (u64, u64) {
        let n = self.lock().resident;
        (n * self.block_bytes as u64, n)
    }

    /// The stored blocks of `keys`, in order, up to the first one missing or damaged; and how
    /// many damaged blocks were found (deleted, so they are recomputed and stored again).
    pub fn load(&self, keys: &[BlockKey]) -> Result<(Vec<Arc<Block>>, usize), WorkloadError> {
        let mut d = self.lock();
        let mut out = Vec::new();
        for key in keys {
            let row: Option<(i64, String, i64, Option<i64>)> = d
                .store
                .conn()
                .prepare_cached("SELECT id, codec, checksum, slot FROM kv_lineage WHERE block_key = ?1")?
                .query_row([key_hex(key)], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()?;
            let Some((id, codec, sum, slot)) = row else { break };
            let block = match self.read(&d, id, &codec, sum, slot)? {
                Some(b) => b,
                None => {
                    tracing::warn!(block = &key_hex(key)[..16], "KV block failed its checksum; deleted, it will be recomputed");
                    d.delete(id)?;
                    return Ok((out, 1));
                }
            };
            out.push(Arc::new(block));
        }
        Ok((out, 0))
    }

    /// The stored blocks after `parent` (`None`: the first blocks of `tenant` on `model_id`),
    /// with their tokens (at most `block_tokens`; fewer for a stored tail).
    pub fn children(&self, tenant: &str, model_id: &str, parent: Option<&BlockKey>) -> Result<Vec<Child>, WorkloadError> {
        let d = self.lock();
        let conn = d.store.conn();
        let mut st = conn.prepare_cached(
            "SELECT block_key, tokens FROM kv_lineage
             WHERE parent_key IS ?1 AND tenant = ?2 AND model_id = ?3 AND token_count <= ?4
             ORDER BY last_used_at DESC LIMIT 64",
        )?;
        let rows = st.query_map(params![parent.map(key_hex), tenant, model_id, self.geom.block_tokens as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (key, tokens) = row?;
            // A row that does not parse is skipped (its block is never served).
            if let (Some(key), Ok(tokens)) = (key_from_hex(&key), serde_json::from_str::<Vec<u32>>(&tokens)) {
                out.push(Child { key, tokens: tokens.into() });
            }
        }
        Ok(out)
    }

    /// The decoded block of row `id`, or `None` when its bytes are missing or do not match.
    fn read(&self, d: &Disk, id: i64, codec: &str, sum: i64, slot: Option<i64>) -> Result<Option<Block>, WorkloadError> {
        let codec = Codec::parse(codec)?;
        let check = |bytes: &[u8]| (checksum(bytes) == sum).then(|| codec.decode(&self.geom, bytes).ok()).flatten();
        Ok(match (&d.side, slot) {
            (Some(side), Some(slot)) => side.bytes(slot.max(0) as u64, self.block_bytes).and_then(check),
            (None, _) => {
                let data: Option<Vec<u8>> =
                    d.store.conn().prepare_cached("SELECT data FROM kv_block_data WHERE lineage_id = ?1")?.query_row([id], |r| r.get(0)).optional()?;
                data.as_deref().and_then(check)
            }
            (Some(_), None) => None,
        })
    }

    /// Stores what a finished request computed and reused, in one transaction.
    pub fn record(&self, r: &Record<'_>) -> Result<usize, WorkloadError> {
        let t0 = std::time::Instant::now();
        let mut guard = self.lock();
        let d = &mut *guard;
        let mut conn = d.store.conn();
        let tx = conn.transaction()?;
        {
            let mut touch = tx.prepare_cached(&format!(
                "UPDATE kv_lineage SET last_used_at = {}, reuse_count = reuse_count + 1 WHERE block_key = ?1",
                now_sql!()
            ))?;
            for key in r.used {
                touch.execute([key_hex(key)])?;
            }
        }
        let mut ours: Vec<i64> = Vec::new();
        let mut resident = d.resident;
        let mut freed: Vec<u64> = Vec::new();
        let mut stored = 0;
        for b in r.new_blocks {
            let hex = key_hex(&b.key);
            let have: Option<i64> = tx.prepare_cached("SELECT id FROM kv_lineage WHERE block_key = ?1")?.query_row([&hex], |x| x.get(0)).optional()?;
            if let Some(id) = have {
                tx.execute(&format!("UPDATE kv_lineage SET last_used_at = {} WHERE id = ?1", now_sql!()), [id])?;
                continue;
            }
            if self.max_blocks == 0 {
                break;
            }
            if resident >= self.max_blocks {
                match evict_lru(&tx, &ours)? {
                    Some(slot) => {
                        resident -= 1;
                        freed.extend(slot);
                    }
                    None => break, // everything stored is this request's own: the budget is full
                }
            }
            let bytes = self.codec.encode(&self.geom, &b.block);
            let slot = match d.side.as_mut() {
                Some(side) => {
                    let slot = freed.pop().or_else(|| side.free.pop()).unwrap_or_else(|| {
                        side.next += 1;
                        side.next - 1
                    });
                    side.write(slot, &bytes, self.max_blocks)?;
                    Some(slot as i64)
                }
                None => None,
            };
            let tokens = serde_json::to_string(&b.tokens).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
            tx.prepare_cached(
                "INSERT INTO kv_lineage (tenant, model_id, block_key, parent_key, position, token_count, tokens, inference_id,
                     codec, size_bytes, checksum, storage, slot)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                r.tenant,
                r.model_id,
                hex,
                b.parent.as_ref().map(key_hex),
                b.position as i64,
                b.tokens.len() as i64,
                tokens,
                r.inference_id,
                self.codec.as_str(),
                bytes.len() as i64,
                checksum(&bytes),
                self.storage.as_str(),
                slot,
            ])?;
            let id = tx.last_insert_rowid();
            if d.side.is_none() {
                tx.prepare_cached("INSERT INTO kv_block_data (lineage_id, data) VALUES (?1, ?2)")?.execute(params![id, bytes])?;
            }
            ours.push(id);
            resident += 1;
            stored += 1;
        }
        tx.execute(
            "INSERT INTO kv_requests (inference_id, tenant, prompt_blocks, blocks_memory, blocks_disk, blocks_corrupt, blocks_stored,
                 kv_tokens_reused, load_ms, store_ms, memory_bytes, disk_bytes, partial_tokens, prompt_tokens,
                 blend_tokens_reused, blend_tokens_recomputed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            params![
                r.inference_id,
                r.tenant,
                r.prompt_blocks as i64,
                r.blocks_memory as i64,
                r.blocks_disk as i64,
                r.blocks_corrupt as i64,
                stored as i64,
                r.kv_tokens_reused as i64,
                r.load_ms,
                t0.elapsed().as_secs_f64() * 1e3,
                r.memory_bytes as i64,
                (resident * self.block_bytes as u64) as i64,
                r.partial_tokens as i64,
                r.prompt_tokens as i64,
                r.blend_tokens_reused as i64,
                r.blend_tokens_recomputed as i64,
            ],
        )?;
        if let Some((key, tokens, text)) = &r.fragment {
            tx.execute(
                &format!(
                    "INSERT INTO semantic_fragments (tenant, inference_id, text, kind, kv_block_key, token_count, reuse_count, last_reused_at)
                     VALUES (?1, ?2, ?3, 'kv_prefix', ?4, ?5, 1, {now})
                     ON CONFLICT (tenant, kv_block_key) WHERE kv_block_key IS NOT NULL
                     DO UPDATE SET reuse_count = reuse_count + 1, last_reused_at = {now}",
                    now = now_sql!()
                ),
                params![r.tenant, r.inference_id, text, key_hex(key), *tokens as i64],
            )?;
        }
        tx.commit()?;
        drop(conn);
        d.resident = resident;
        if let Some(side) = d.side.as_mut() {
            side.free.extend(freed);
        }
        Ok(stored)
    }
}

impl Disk {
    fn count(&self) -> Result<u64, WorkloadError> {
        Ok(self.store.conn().query_row("SELECT COUNT(*) FROM kv_lineage", [], |r| r.get::<_, i64>(0))?.max(0) as u64)
    }

    fn evict_one(&mut self, keep: &[i64]) -> Result<bool, WorkloadError> {
        let slot = {
            let mut conn = self.store.conn();
            let tx = conn.transaction()?;
            let slot = evict_lru(&tx, keep)?;
            tx.commit()?;
            slot
        };
        Ok(match slot {
            None => false,
            Some(slot) => {
                self.resident -= 1;
                if let (Some(side), Some(s)) = (self.side.as_mut(), slot) {
                    side.free.push(s);
                }
                true
            }
        })
    }

    fn delete(&mut self, id: i64) -> Result<(), WorkloadError> {
        let slot: Option<i64> = self.store.conn().query_row("DELETE FROM kv_lineage WHERE id = ?1 RETURNING slot", [id], |r| r.get(0)).optional()?.flatten();
        self.resident = self.resident.saturating_sub(1);
        if let (Some(side), Some(s)) = (self.side.as_mut(), slot) {
            side.free.push(s.max(0) as u64);
        }
        Ok(())
    }
}

/// Deletes the least recently used row not in `keep` (children before parents on ties).
/// `None`: nothing to evict; `Some(slot)`: evicted, with its side-file slot if it had one.
fn evict_lru(tx: &Transaction<'_>, keep: &[i64]) -> Result<Option<Option<u64>>, WorkloadError> {
    let keep = serde_json::to_string(keep).map_err(|e| WorkloadError::Invalid(e.to_string()))?;
    let row: Option<(i64, Option<i64>)> = tx
        .prepare_cached(
            "SELECT id, slot FROM kv_lineage WHERE id NOT IN (SELECT value FROM json_each(?1))
             ORDER BY last_used_at, position DESC, id LIMIT 1",
        )?
        .query_row([keep], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((id, slot)) = row else { return Ok(None) };
    tx.execute("DELETE FROM kv_lineage WHERE id = ?1", [id])?;
    Ok(Some(slot.map(|s| s.max(0) as u64)))
}

/// The side file's index (its `kv_lineage` rows) is consistent: the table and its indexes pass
/// SQLite's `integrity_check` (whatever `--db-check` did for the whole file: the table is
/// small), every slot is held by one block at most and none is negative. (A slot past the
/// file's end is not damage: its block fails its checksum and is recomputed.) Only reads.
fn check_index(conn: &Connection, side: &Path) -> Result<(), WorkloadError> {
    let damaged = |what: String| WorkloadError::DamagedIndex { what, side: side.to_path_buf() };
    let report: Vec<String> = {
        let mut st = conn.prepare("PRAGMA integrity_check(kv_lineage)")?;
        let rows = st.query_map([], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    if report != ["ok"] {
        return Err(damaged(format!("SQLite's integrity_check of kv_lineage: {}", report.join("; "))));
    }
    let shared: Vec<(i64, i64)> = {
        let mut st = conn.prepare(
            "SELECT slot, COUNT(*) FROM kv_lineage WHERE storage = 'file' AND slot IS NOT NULL GROUP BY slot HAVING COUNT(*) > 1 LIMIT 3",
        )?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    if let Some(&(slot, n)) = shared.first() {
        return Err(damaged(format!("{n} blocks claim slot {slot}{}", if shared.len() > 1 { ", and more" } else { "" })));
    }
    let negative: i64 = conn.query_row("SELECT COUNT(*) FROM kv_lineage WHERE storage = 'file' AND slot < 0", [], |r| r.get(0))?;
    if negative > 0 {
        return Err(damaged(format!("{negative} blocks have a negative slot")));
    }
    Ok(())
}

/// Moves blocks stored in slots at or past `max_blocks` (the budget shrank) into free slots
/// below it; called once the rows fit the budget.
fn compact(conn: &Connection, file: &mut File, block_bytes: usize, max_blocks: u64) -> Result<(), WorkloadError> {
    use std::io::Read;
    let slots = |sql: &str| -> Result<Vec<(i64, i64)>, WorkloadError> {
        let mut st = conn.prepare(sql)?;
        let rows = st.query_map([max_blocks as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    };
    let outside = slots("SELECT id, slot FROM kv_lineage WHERE slot >= ?1")?;
    if outside.is_empty() {
        return Ok(());
    }
    let used: Vec<i64> = slots("SELECT id, slot FROM kv_lineage WHERE slot < ?1")?.into_iter().map(|(_, s)| s).collect();
    let mut free = (0..max_blocks as i64).filter(|s| !used.contains(s));
    let mut buf = vec![0u8; block_bytes];
    for (id, from) in outside {
        let Some(to) = free.next() else { break };
        file.seek(SeekFrom::Start(from as u64 * block_bytes as u64))?;
        // A short file leaves zeros: the checksum then fails and the block is recomputed.
        let mut n = 0;
        while n < buf.len() {
            match file.read(&mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        buf[n..].fill(0);
        file.seek(SeekFrom::Start(to as u64 * block_bytes as u64))?;
        file.write_all(&buf)?;
        conn.execute("UPDATE kv_lineage SET slot = ?1 WHERE id = ?2", [to, id])?;
    }
    Ok(())
}

/// `<db>.kv`: the side file beside the database.
pub fn side_file_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".kv");
    db.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::inferences::tests::sample;
    use crate::store::{CacheMode, ServedFrom};
    use half::f16;

    const G: Geometry = Geometry { rows: 2, head_dim: 32, block_tokens: 4 };

    fn block(i: usize) -> NewBlock {
        let vals = |s: f32| (0..G.values()).map(|j| f16::from_f32((j as f32 * 0.01 + i as f32) * s)).collect();
        NewBlock { key: [i as u8; 32], parent: None, position: 4 * i, tokens: vec![i as u32; 4], block: Arc::new(Block { k: vals(1.0), v: vals(-1.0) }) }
    }

    fn record<'a>(inference_id: i64, new_blocks: &'a [NewBlock], used: &'a [BlockKey]) -> Record<'a> {
        Record {
            tenant: "t",
            model_id: "m",
            inference_id,
            used,
            new_blocks,
            prompt_blocks: new_blocks.len(),
            blocks_memory: 0,
            blocks_disk: 0,
            blocks_corrupt: 0,
            kv_tokens_reused: 0,
            partial_tokens: 0,
            prompt_tokens: 0,
            blend_tokens_reused: 0,
            blend_tokens_recomputed: 0,
            load_ms: 0.0,
            memory_bytes: 0,
            fragment: None,
        }
    }

    fn inference(store: &SqliteStore) -> i64 {
        store.record_inference(&sample("t", None, ServedFrom::Model, CacheMode::Auto)).expect("inference")
    }

    #[test]
    fn blocks_round_trip_within_the_budget_and_damage_is_detected() {
        for storage in [Storage::File, Storage::Blob] {
            let dir = tempfile::tempdir().expect("tempdir");
            let db = dir.path().join("k.db");
            let store = Arc::new(SqliteStore::open(&db).expect("store"));
            let bytes = Codec::F16.block_bytes(&G) as u64;
            let tier = DiskTier::open(store.clone(), G, Codec::F16, storage, 3 * bytes + 7).expect("tier");
            let blocks: Vec<NewBlock> = (0..5).map(block).collect();
            let keys: Vec<BlockKey> = blocks.iter().map(|b| b.key).collect();

            let stored = tier.record(&record(inference(&store), &blocks[..2], &[])).expect("record");
            assert_eq!(stored, 2);
            let (got, bad) = tier.load(&keys).expect("load");
            assert_eq!((got.len(), bad), (2, 0), "{storage:?}: the two stored blocks, then a miss");
            assert_eq!(*got[1], *blocks[1].block);

            // Two more: the budget holds three, so the least recently used goes: block 1, since
            // block 0 was used again in between.
            std::thread::sleep(std::time::Duration::from_millis(5));
            tier.record(&record(inference(&store), &[], &keys[..1])).expect("touch");
            std::thread::sleep(std::time::Duration::from_millis(5));
            tier.record(&record(inference(&store), &blocks[2..4], &[])).expect("record more");
            assert_eq!(tier.usage(), (3 * bytes, 3));
            let resident: Vec<bool> = keys.iter().map(|k| tier.load(std::slice::from_ref(k)).expect("load").0.len() == 1).collect();
            assert_eq!(resident, [true, false, true, true, false], "{storage:?}");
            if let Some(side) = tier.side_file() {
                assert!(std::fs::metadata(&side).expect("side file").len() <= 3 * bytes);
            }

            // Damage block 3's bytes: detected, deleted, not returned.
            let conn = Connection::open(&db).expect("conn");
            let (id, slot): (i64, Option<i64>) =
                conn.query_row("SELECT id, slot FROM kv_lineage WHERE position = 12", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("row");
            match (tier.side_file(), slot) {
                (Some(path), Some(slot)) => {
                    let mut data = std::fs::read(&path).expect("read");
                    data[slot as usize * bytes as usize + 100] ^= 0x40;
                    std::fs::write(&path, data).expect("write");
                }
                _ => {
                    let mut data: Vec<u8> = conn.query_row("SELECT data FROM kv_block_data WHERE lineage_id = ?1", [id], |r| r.get(0)).expect("blob");
                    data[100] ^= 0x40;
                    conn.execute("UPDATE kv_block_data SET data = ?1 WHERE lineage_id = ?2", params![data, id]).expect("update");
                }
            }
            assert_eq!(tier.load(&keys[3..]).expect("load").0.len(), 0, "{storage:?}: a damaged block is never served");
            assert_eq!(tier.load(&keys[3..4]).expect("load"), (Vec::new(), 0), "and it is gone");
            assert_eq!(tier.usage().1, 2);
            drop(tier);

            // Reopened with a smaller budget: the least recently used go.
            let tier = DiskTier::open(store.clone(), G, Codec::F16, storage, bytes).expect("reopen");
            assert_eq!(tier.usage(), (bytes, 1));
            assert_eq!(tier.load(&keys[2..3]).expect("load").0.len(), 1, "the most recent block stays");
        }
    }
}
