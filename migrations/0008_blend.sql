-- 0008: the BLEND cache mode (opt-in, lossy: a request's documents reuse KV computed for them
-- at other positions, re-rotated, a fraction of their tokens recomputed). `inferences` is rebuilt
-- (SQLite cannot change a CHECK) to accept
--   cache_mode  + 'blend'
--   served_from + 'BLEND'
-- and `kv_requests` records, per BLEND request, the document tokens that kept reused KV
-- (`blend_tokens_reused`) and those recomputed in every layer (`blend_tokens_recomputed`);
-- `v_kv_reuse` sums both. Migrations run with foreign keys off (see Store::open).

DROP VIEW v_hit_rates;
DROP VIEW v_recent_inferences;
DROP VIEW v_semantic;
DROP VIEW v_kv_reuse;

CREATE TABLE inferences_new (
    id                  INTEGER PRIMARY KEY,
    created_at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    tenant              TEXT    NOT NULL,
    question            TEXT,
    prompt              TEXT    NOT NULL,
    prompt_hash         TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    model_id            TEXT    NOT NULL,
    params              TEXT    NOT NULL,
    cache_mode          TEXT    NOT NULL CHECK (cache_mode IN ('auto', 'bypass', 'refresh', 'verified', 'trust', 'exact', 'equivalent', 'blend')),
    cache_key           TEXT,
    served_from         TEXT    NOT NULL CHECK (served_from IN ('MODEL', 'EXACT', 'FACT', 'VERIFIED', 'PARTIAL', 'TRUST', 'EQUIVALENT', 'BLEND')),
    source_inference_id INTEGER REFERENCES inferences (id),
    source_fact_id      INTEGER REFERENCES facts (id),
    similarity          REAL,
    prompt_tokens       INTEGER NOT NULL,
    completion_tokens   INTEGER NOT NULL,
    tokens_computed     INTEGER NOT NULL,
    tokens_reused       INTEGER NOT NULL,
    stop_reason         TEXT    NOT NULL CHECK (stop_reason IN ('stop', 'length', 'context_full', 'cancelled')),
    response            TEXT    NOT NULL,
    response_tokens     TEXT    NOT NULL,
    queue_ms            REAL    NOT NULL DEFAULT 0,
    prefill_ms          REAL    NOT NULL DEFAULT 0,
    decode_ms           REAL    NOT NULL DEFAULT 0,
    latency_ms          REAL    NOT NULL,
    backend             TEXT    NOT NULL,
    superseded_by       INTEGER REFERENCES inferences (id),
    ttft_ms             REAL,
    kv_tokens_reused    INTEGER NOT NULL DEFAULT 0,
    draft_tokens        INTEGER NOT NULL DEFAULT 0,
    draft_accepted      INTEGER NOT NULL DEFAULT 0,
    candidates_tried    INTEGER NOT NULL DEFAULT 0,
    response_logprobs   BLOB,
    equivalence_mean    REAL,
    equivalence_worst   REAL,
    equivalence_checks  INTEGER NOT NULL DEFAULT 0
);
INSERT INTO inferences_new (id, created_at, tenant, question, prompt, prompt_hash, model, model_id, params,
    cache_mode, cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
    completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens, queue_ms,
    prefill_ms, decode_ms, latency_ms, backend, superseded_by, ttft_ms, kv_tokens_reused, draft_tokens,
    draft_accepted, candidates_tried, response_logprobs, equivalence_mean, equivalence_worst, equivalence_checks)
SELECT id, created_at, tenant, question, prompt, prompt_hash, model, model_id, params,
    cache_mode, cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
    completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens, queue_ms,
    prefill_ms, decode_ms, latency_ms, backend, superseded_by, ttft_ms, kv_tokens_reused, draft_tokens,
    draft_accepted, candidates_tried, response_logprobs, equivalence_mean, equivalence_worst, equivalence_checks
FROM inferences;
DROP TABLE inferences;
ALTER TABLE inferences_new RENAME TO inferences;
CREATE INDEX inferences_exact ON inferences (tenant, cache_key) WHERE cache_key IS NOT NULL;
CREATE INDEX inferences_tenant_time ON inferences (tenant, created_at);

CREATE VIEW v_hit_rates AS
SELECT tenant,
       served_from,
       COUNT(*)                                                        AS requests,
       ROUND(1.0 * COUNT(*) / SUM(COUNT(*)) OVER (PARTITION BY tenant), 4) AS share,
       SUM(tokens_computed)                                            AS tokens_computed,
       SUM(tokens_reused)                                              AS tokens_reused,
       SUM(kv_tokens_reused)                                           AS kv_tokens_reused,
       SUM(draft_accepted)                                             AS draft_accepted,
       SUM(draft_tokens)                                               AS draft_tokens,
       ROUND(AVG(latency_ms), 3)                                       AS avg_latency_ms,
       ROUND(AVG(ttft_ms), 3)                                          AS avg_ttft_ms
FROM inferences
GROUP BY tenant, served_from;

CREATE VIEW v_recent_inferences AS
SELECT id,
       created_at,
       tenant,
       served_from,
       cache_mode,
       stop_reason,
       prompt_tokens,
       completion_tokens,
       tokens_computed,
       tokens_reused,
       kv_tokens_reused,
       draft_accepted,
       ROUND(latency_ms, 3)                  AS latency_ms,
       ROUND(ttft_ms, 3)                     AS ttft_ms,
       source_inference_id,
       similarity,
       ROUND(equivalence_mean, 4)            AS equivalence_mean,
       substr(COALESCE(question, prompt), 1, 80) AS question,
       substr(response, 1, 80)               AS response
FROM inferences
ORDER BY id DESC
LIMIT 100;

CREATE VIEW v_semantic AS
SELECT tenant,
       SUM(served_from = 'VERIFIED')                                   AS verified,
       SUM(served_from = 'PARTIAL')                                    AS partial,
       SUM(served_from = 'TRUST')                                      AS trusted,
       SUM(served_from = 'EQUIVALENT')                                 AS equivalent,
       SUM(equivalence_checks)                                         AS equivalence_checks,
       COUNT(*)                                                        AS requests,
       SUM(draft_tokens)                                               AS draft_tokens,
       SUM(draft_accepted)                                             AS draft_accepted,
       ROUND(1.0 * SUM(draft_accepted) / MAX(SUM(draft_tokens), 1), 4) AS acceptance
FROM inferences
GROUP BY tenant;

ALTER TABLE kv_requests ADD COLUMN blend_tokens_reused     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE kv_requests ADD COLUMN blend_tokens_recomputed INTEGER NOT NULL DEFAULT 0;

CREATE VIEW v_kv_reuse AS
SELECT r.tenant,
       COUNT(*)                                                         AS requests,
       SUM(r.kv_tokens_reused)                                          AS kv_tokens_reused,
       SUM(r.partial_tokens)                                            AS partial_tokens_reused,
       SUM(MAX(r.prompt_tokens - r.kv_tokens_reused, 0))                AS prompt_tokens_computed,
       SUM(r.blend_tokens_reused)                                       AS blend_tokens_reused,
       SUM(r.blend_tokens_recomputed)                                   AS blend_tokens_recomputed,
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
