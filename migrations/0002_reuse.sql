-- 0002: reuse beyond exact repeats. `inferences` is rebuilt (SQLite cannot change a CHECK) to
-- accept the semantic cache modes and tiers and to record what reuse saved:
--   cache_mode  + 'verified' (semantic drafts checked by the model), 'trust' (learned decision,
--               falls back to verified), 'exact' (exact cache only)
--   served_from + 'VERIFIED' (a neighbour's whole answer accepted by the model),
--                 'PARTIAL'  (a prefix of it accepted, the rest decoded),
--                 'TRUST'    (a neighbour's answer served without running the model)
--   ttft_ms           request received to first token
--   kv_tokens_reused  prompt tokens whose KV came from stored blocks instead of prefill
--   draft_tokens      draft tokens offered for verification; draft_accepted: those the model agreed with
--   candidates_tried  neighbours whose answers were tried as drafts
-- Migrations run with foreign keys off (see Store::open), so the rebuild keeps every reference.

DROP VIEW v_hit_rates;
DROP VIEW v_recent_inferences;

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
    cache_mode          TEXT    NOT NULL CHECK (cache_mode IN ('auto', 'bypass', 'refresh', 'verified', 'trust', 'exact')),
    cache_key           TEXT,
    served_from         TEXT    NOT NULL CHECK (served_from IN ('MODEL', 'EXACT', 'FACT', 'VERIFIED', 'PARTIAL', 'TRUST')),
    -- EXACT/VERIFIED/PARTIAL/TRUST: the inference whose answer was replayed or used as the draft.
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
    candidates_tried    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO inferences_new (id, created_at, tenant, question, prompt, prompt_hash, model, model_id, params,
    cache_mode, cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
    completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens, queue_ms,
    prefill_ms, decode_ms, latency_ms, backend, superseded_by)
SELECT id, created_at, tenant, question, prompt, prompt_hash, model, model_id, params,
    cache_mode, cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
    completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens, queue_ms,
    prefill_ms, decode_ms, latency_ms, backend, superseded_by
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
       substr(COALESCE(question, prompt), 1, 80) AS question,
       substr(response, 1, 80)               AS response
FROM inferences
ORDER BY id DESC
LIMIT 100;
