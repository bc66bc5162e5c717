-- 0002 (PostgreSQL): as migrations/0002_reuse.sql: the semantic cache modes and tiers, and what
-- reuse saved. PostgreSQL changes a CHECK and adds columns in place (SQLite rebuilds the table).
DROP VIEW v_hit_rates;
DROP VIEW v_recent_inferences;
ALTER TABLE inferences DROP CONSTRAINT inferences_cache_mode;
ALTER TABLE inferences ADD CONSTRAINT inferences_cache_mode CHECK (cache_mode IN ('auto', 'bypass', 'refresh', 'verified', 'trust', 'exact'));
ALTER TABLE inferences DROP CONSTRAINT inferences_served_from;
ALTER TABLE inferences ADD CONSTRAINT inferences_served_from CHECK (served_from IN ('MODEL', 'EXACT', 'FACT', 'VERIFIED', 'PARTIAL', 'TRUST'));
ALTER TABLE inferences
    ADD COLUMN ttft_ms          DOUBLE PRECISION,
    ADD COLUMN kv_tokens_reused BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN draft_tokens     BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN draft_accepted   BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN candidates_tried BIGINT NOT NULL DEFAULT 0;

CREATE VIEW v_hit_rates AS
SELECT tenant,
       served_from,
       COUNT(*)                                                                 AS requests,
       ROUND(1.0 * COUNT(*) / SUM(COUNT(*)) OVER (PARTITION BY tenant), 4)      AS share,
       SUM(tokens_computed)                                                     AS tokens_computed,
       SUM(tokens_reused)                                                       AS tokens_reused,
       SUM(kv_tokens_reused)                                                    AS kv_tokens_reused,
       SUM(draft_accepted)                                                      AS draft_accepted,
       SUM(draft_tokens)                                                        AS draft_tokens,
       ROUND(AVG(latency_ms)::numeric, 3)                                       AS avg_latency_ms,
       ROUND(AVG(ttft_ms)::numeric, 3)                                          AS avg_ttft_ms
FROM inferences
GROUP BY tenant, served_from;

CREATE VIEW v_recent_inferences AS
SELECT id, created_at, tenant, served_from, cache_mode, stop_reason, prompt_tokens, completion_tokens,
       tokens_computed, tokens_reused, kv_tokens_reused, draft_accepted,
       ROUND(latency_ms::numeric, 3) AS latency_ms,
       ROUND(ttft_ms::numeric, 3)    AS ttft_ms,
       source_inference_id, similarity,
       substr(COALESCE(question, prompt), 1, 80) AS question,
       substr(response, 1, 80)                   AS response
FROM inferences
ORDER BY id DESC
LIMIT 100;
