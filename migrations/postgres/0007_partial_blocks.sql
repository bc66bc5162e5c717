-- 0007 (PostgreSQL twin of migrations/0007_partial_blocks.sql): token-granular KV reuse.
-- `kv_requests` records the tokens reused from partial-block matches and the prompt's length
-- (tokens computed = prompt_tokens - kv_tokens_reused); `v_kv_reuse` shows both. The parent
-- index serves partial matches of the shared KV tier (`--kv-storage blob`) and keeps the two schemas one.
ALTER TABLE kv_requests ADD COLUMN partial_tokens BIGINT NOT NULL DEFAULT 0;
ALTER TABLE kv_requests ADD COLUMN prompt_tokens  BIGINT NOT NULL DEFAULT 0;
CREATE INDEX kv_lineage_parent ON kv_lineage (parent_key);

DROP VIEW v_kv_reuse;
CREATE VIEW v_kv_reuse AS
SELECT r.tenant,
       COUNT(*)                                                         AS requests,
       SUM(r.kv_tokens_reused)                                          AS kv_tokens_reused,
       SUM(r.partial_tokens)                                            AS partial_tokens_reused,
       SUM(GREATEST(r.prompt_tokens - r.kv_tokens_reused, 0))           AS prompt_tokens_computed,
       SUM(r.prompt_blocks)                                             AS prompt_blocks,
       SUM(r.blocks_memory)                                             AS blocks_from_memory,
       SUM(r.blocks_disk)                                               AS blocks_from_disk,
       SUM(r.blocks_corrupt)                                            AS blocks_corrupt,
       ROUND(1.0 * SUM(r.blocks_memory + r.blocks_disk) / GREATEST(SUM(r.prompt_blocks), 1), 4) AS block_hit_rate,
       (SELECT COUNT(*) FROM kv_lineage l WHERE l.tenant = r.tenant)    AS disk_blocks,
       (SELECT COALESCE(SUM(size_bytes), 0) FROM kv_lineage l WHERE l.tenant = r.tenant) AS disk_bytes,
       (SELECT memory_bytes FROM kv_requests x ORDER BY x.created_at DESC, x.inference_id DESC LIMIT 1) AS memory_bytes
FROM kv_requests r
GROUP BY r.tenant;
