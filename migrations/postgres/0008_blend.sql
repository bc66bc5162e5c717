-- 0008 (PostgreSQL twin of migrations/0008_blend.sql): the BLEND cache mode. PostgreSQL
-- replaces the two CHECK constraints in place (SQLite rebuilds the table); `kv_requests` gains
-- the BLEND columns (written with the shared block tier, `--kv-storage blob`) and `v_kv_reuse`
-- sums them, so both schemas stay one.

ALTER TABLE inferences DROP CONSTRAINT inferences_cache_mode;
ALTER TABLE inferences ADD CONSTRAINT inferences_cache_mode
    CHECK (cache_mode IN ('auto', 'bypass', 'refresh', 'verified', 'trust', 'exact', 'equivalent', 'blend'));
ALTER TABLE inferences DROP CONSTRAINT inferences_served_from;
ALTER TABLE inferences ADD CONSTRAINT inferences_served_from
    CHECK (served_from IN ('MODEL', 'EXACT', 'FACT', 'VERIFIED', 'PARTIAL', 'TRUST', 'EQUIVALENT', 'BLEND'));

ALTER TABLE kv_requests ADD COLUMN blend_tokens_reused     BIGINT NOT NULL DEFAULT 0;
ALTER TABLE kv_requests ADD COLUMN blend_tokens_recomputed BIGINT NOT NULL DEFAULT 0;

DROP VIEW v_kv_reuse;
CREATE VIEW v_kv_reuse AS
SELECT r.tenant,
       COUNT(*)                                                         AS requests,
       SUM(r.kv_tokens_reused)                                          AS kv_tokens_reused,
       SUM(r.partial_tokens)                                            AS partial_tokens_reused,
       SUM(GREATEST(r.prompt_tokens - r.kv_tokens_reused, 0))           AS prompt_tokens_computed,
       SUM(r.blend_tokens_reused)                                       AS blend_tokens_reused,
       SUM(r.blend_tokens_recomputed)                                   AS blend_tokens_recomputed,
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
