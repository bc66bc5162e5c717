-- 0004: KV-block reuse. `kv_lineage` (empty until now) is recreated for fixed-size blocks keyed
-- by a SHA-256 chain; the blocks' bytes live in a side file of fixed-size slots (`<db>.kv`,
-- storage 'file') or in `kv_block_data` (storage 'blob'). `kv_requests` records what each
-- computed request reused and stored. `semantic_fragments` (empty until now) is rebuilt so a
-- fragment may be a recurring prompt prefix without an embedding, with a reuse count.

DROP TABLE kv_lineage;
CREATE TABLE kv_lineage (
    id           INTEGER PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    model_id     TEXT    NOT NULL,
    -- sha256 chain (hex) over tenant salt, model id, block size, parent key, block tokens.
    block_key    TEXT    NOT NULL UNIQUE,
    -- The previous block's key; NULL for a prompt's first block.
    parent_key   TEXT,
    -- Position of the block's first token; token_count tokens (JSON array in `tokens`).
    position     INTEGER NOT NULL,
    token_count  INTEGER NOT NULL,
    tokens       TEXT    NOT NULL,
    -- The request that computed it.
    inference_id INTEGER REFERENCES inferences (id),
    codec        TEXT    NOT NULL CHECK (codec IN ('f16', 'q8_0', 'q4_0')),
    size_bytes   INTEGER NOT NULL,
    -- 64-bit checksum of the stored bytes (workload::codec::checksum, xxHash64-style).
    checksum     INTEGER NOT NULL,
    storage      TEXT    NOT NULL CHECK (storage IN ('file', 'blob')),
    -- Slot in the side file (storage 'file'): bytes at slot * size_bytes.
    slot         INTEGER,
    -- Times requests loaded it (from memory or disk).
    reuse_count  INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_used_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE UNIQUE INDEX kv_lineage_slot ON kv_lineage (slot) WHERE slot IS NOT NULL;
CREATE INDEX kv_lineage_lru ON kv_lineage (last_used_at, position);
CREATE INDEX kv_lineage_tenant ON kv_lineage (tenant);

CREATE TABLE kv_block_data (
    lineage_id INTEGER PRIMARY KEY REFERENCES kv_lineage (id) ON DELETE CASCADE,
    data       BLOB    NOT NULL
);

-- One row per computed request that could reuse KV (not BYPASS).
CREATE TABLE kv_requests (
    inference_id     INTEGER PRIMARY KEY REFERENCES inferences (id),
    tenant           TEXT    NOT NULL,
    -- Whole blocks in the prompt; of its reusable prefix: from memory, from disk.
    prompt_blocks    INTEGER NOT NULL,
    blocks_memory    INTEGER NOT NULL,
    blocks_disk      INTEGER NOT NULL,
    -- Stored blocks that failed their checksum (deleted, recomputed).
    blocks_corrupt   INTEGER NOT NULL,
    -- New blocks written to disk.
    blocks_stored    INTEGER NOT NULL,
    kv_tokens_reused INTEGER NOT NULL,
    -- Finding and reading the prefix; writing the new blocks.
    load_ms          REAL    NOT NULL,
    store_ms         REAL    NOT NULL,
    -- The tiers' size when the request finished (memory: this process; disk: all tenants).
    memory_bytes     INTEGER NOT NULL,
    disk_bytes       INTEGER NOT NULL,
    created_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX kv_requests_tenant_time ON kv_requests (tenant, created_at);

CREATE TABLE semantic_fragments_new (
    id              INTEGER PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    inference_id    INTEGER REFERENCES inferences (id),
    fact_id         INTEGER REFERENCES facts (id),
    text            TEXT    NOT NULL,
    -- 'text' (embedded text), 'kv_prefix' (a prompt prefix requests reused as KV blocks).
    kind            TEXT    NOT NULL DEFAULT 'text',
    -- NULL for fragments that are not embedded (kv_prefix).
    embedding_model TEXT,
    embedding       BLOB,
    -- kv_prefix: the key of its last block, its length in tokens.
    kv_block_key    TEXT,
    token_count     INTEGER,
    reuse_count     INTEGER NOT NULL DEFAULT 0,
    last_reused_at  TEXT,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
INSERT INTO semantic_fragments_new (id, tenant, inference_id, fact_id, text, embedding_model, embedding, created_at)
SELECT id, tenant, inference_id, fact_id, text, embedding_model, embedding, created_at FROM semantic_fragments;
DROP TABLE semantic_fragments;
ALTER TABLE semantic_fragments_new RENAME TO semantic_fragments;
CREATE INDEX semantic_fragments_tenant ON semantic_fragments (tenant);
CREATE UNIQUE INDEX semantic_fragments_kv ON semantic_fragments (tenant, kv_block_key) WHERE kv_block_key IS NOT NULL;

-- Per tenant: KV reuse of computed requests, block hit rate (blocks of the reusable prefix
-- found / whole prompt blocks), memory and disk hits, and what the disk tier holds for it.
CREATE VIEW v_kv_reuse AS
SELECT r.tenant,
       COUNT(*)                                                         AS requests,
       SUM(r.kv_tokens_reused)                                          AS kv_tokens_reused,
       SUM(r.prompt_blocks)                                             AS prompt_blocks,
       SUM(r.blocks_memory)                                             AS blocks_from_memory,
       SUM(r.blocks_disk)                                               AS blocks_from_disk,
       SUM(r.blocks_corrupt)                                            AS blocks_corrupt,
       ROUND(1.0 * SUM(r.blocks_memory + r.blocks_disk) / MAX(SUM(r.prompt_blocks), 1), 4) AS block_hit_rate,
       (SELECT COUNT(*) FROM kv_lineage l WHERE l.tenant = r.tenant)    AS disk_blocks,
       (SELECT COALESCE(SUM(size_bytes), 0) FROM kv_lineage l WHERE l.tenant = r.tenant) AS disk_bytes,
       (SELECT memory_bytes FROM kv_requests x ORDER BY x.created_at DESC, x.inference_id DESC LIMIT 1) AS memory_bytes
FROM kv_requests r
GROUP BY r.tenant;
