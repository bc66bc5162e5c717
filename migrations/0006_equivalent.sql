-- 0005: the EQUIVALENT cache mode (a neighbour's answer scored by the model under the new prompt
-- in one teacher-forced pass, served without decoding when the learned region allows it).
-- `inferences` is rebuilt (SQLite cannot change a CHECK) to accept
--   cache_mode  + 'equivalent'
--   served_from + 'EQUIVALENT'
-- and gains
--   response_logprobs   the model's log-probability (natural log) of each answer token under
--                       its own prompt, the stop token included when the answer ended on one:
--                       float32 little-endian, one per token (NULL: not computed, e.g. BYPASS,
--                       answers from a cache, rows older than this migration)
--   equivalence_mean    EQUIVALENT: the served (or best) candidate's mean per-token margin,
--   equivalence_worst   and its worst-token margin (log-prob under this prompt minus under its own)
--   equivalence_checks  candidate answers the model scored for this request
-- `equivalence_outcomes` holds what exploration found (the run-time evidence EQUIVALENT learns from).
-- Migrations run with foreign keys off (see Store::open), so the rebuild keeps every reference.

DROP VIEW v_hit_rates;
DROP VIEW v_recent_inferences;
DROP VIEW v_semantic;

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
    cache_mode          TEXT    NOT NULL CHECK (cache_mode IN ('auto', 'bypass', 'refresh', 'verified', 'trust', 'exact', 'equivalent')),
    cache_key           TEXT,
    served_from         TEXT    NOT NULL CHECK (served_from IN ('MODEL', 'EXACT', 'FACT', 'VERIFIED', 'PARTIAL', 'TRUST', 'EQUIVALENT')),
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
    draft_accepted, candidates_tried)
SELECT id, created_at, tenant, question, prompt, prompt_hash, model, model_id, params,
    cache_mode, cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
    completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens, queue_ms,
    prefill_ms, decode_ms, latency_ms, backend, superseded_by, ttft_ms, kv_tokens_reused, draft_tokens,
    draft_accepted, candidates_tried
FROM inferences;
DROP TABLE inferences;
ALTER TABLE inferences_new RENAME TO inferences;
CREATE INDEX inferences_exact ON inferences (tenant, cache_key) WHERE cache_key IS NOT NULL;
CREATE INDEX inferences_tenant_time ON inferences (tenant, created_at);

-- One row per explored EQUIVALENT candidate: the request (`inference_id`, whose fresh greedy
-- answer F was decoded), the candidate answer (`source_inference_id`), the questions'
-- `similarity`, the candidate's `mean_margin` / `worst_margin` (its per-token log-probabilities
-- under the new prompt minus under its own), the mean per-token log-likelihood under the new
-- prompt of the candidate (`candidate_ll`) and of F (`fresh_ll`), and `acceptable` = 1 when the
-- candidate is within the configured margin of F (or is F). EQUIVALENT learns its region from these.
CREATE TABLE equivalence_outcomes (
    id                  INTEGER PRIMARY KEY,
    created_at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    tenant              TEXT    NOT NULL,
    model_id            TEXT    NOT NULL,
    inference_id        INTEGER NOT NULL REFERENCES inferences (id),
    source_inference_id INTEGER NOT NULL REFERENCES inferences (id),
    similarity          REAL    NOT NULL,
    mean_margin         REAL    NOT NULL,
    worst_margin        REAL    NOT NULL,
    candidate_ll        REAL    NOT NULL,
    fresh_ll            REAL    NOT NULL,
    acceptable          INTEGER NOT NULL CHECK (acceptable IN (0, 1))
);
CREATE INDEX equivalence_outcomes_tenant ON equivalence_outcomes (tenant, model_id);
CREATE INDEX equivalence_outcomes_source ON equivalence_outcomes (source_inference_id);

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
