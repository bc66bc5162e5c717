-- 0001: the knowledge store. Timestamps are UTC ISO-8601 text with milliseconds
-- ('2026-11-21T19:40:00.123Z'), so they sort and compare as text. Nothing is ever deleted:
-- superseded answers point at their replacement, degraded facts keep their reason.

-- One row per Generate request, whatever served it.
CREATE TABLE inferences (
    id                  INTEGER PRIMARY KEY,
    created_at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    tenant              TEXT    NOT NULL,
    -- The user's question for single-question requests (what facts are filed under), else NULL.
    question            TEXT,
    -- The rendered prompt the model saw, and its sha256 (hex).
    prompt              TEXT    NOT NULL,
    prompt_hash         TEXT    NOT NULL,
    model               TEXT    NOT NULL,
    -- sha256 (hex) of the model file.
    model_id            TEXT    NOT NULL,
    -- JSON: max_tokens, temperature, top_k, top_p, seed, stop.
    params              TEXT    NOT NULL,
    cache_mode          TEXT    NOT NULL CHECK (cache_mode IN ('auto', 'bypass', 'refresh')),
    -- Exact-cache key (sha256 of tenant, model id, prompt, output-changing parameters);
    -- NULL when the answer must not be cached (BYPASS, sampled without a seed).
    cache_key           TEXT,
    served_from         TEXT    NOT NULL CHECK (served_from IN ('MODEL', 'EXACT', 'FACT')),
    -- EXACT: the inference whose answer was replayed. FACT: the fact that answered.
    source_inference_id INTEGER REFERENCES inferences (id),
    source_fact_id      INTEGER REFERENCES facts (id),
    similarity          REAL,
    prompt_tokens       INTEGER NOT NULL,
    completion_tokens   INTEGER NOT NULL,
    -- Positions the model computed (prompt + decode steps); 0 when served without the model.
    tokens_computed     INTEGER NOT NULL,
    -- Tokens whose computation was reused instead of redone.
    tokens_reused       INTEGER NOT NULL,
    stop_reason         TEXT    NOT NULL CHECK (stop_reason IN ('stop', 'length', 'context_full', 'cancelled')),
    response            TEXT    NOT NULL,
    -- JSON array of the generated token ids.
    response_tokens     TEXT    NOT NULL,
    queue_ms            REAL    NOT NULL DEFAULT 0,
    prefill_ms          REAL    NOT NULL DEFAULT 0,
    decode_ms           REAL    NOT NULL DEFAULT 0,
    latency_ms          REAL    NOT NULL,
    backend             TEXT    NOT NULL,
    -- REFRESH: the newer inference that replaced this answer in the exact cache.
    superseded_by       INTEGER REFERENCES inferences (id)
);
CREATE INDEX inferences_exact ON inferences (tenant, cache_key) WHERE cache_key IS NOT NULL;
CREATE INDEX inferences_tenant_time ON inferences (tenant, created_at);

-- Claims: extracted from model answers, provided by users, or deduced.
CREATE TABLE facts (
    id                      INTEGER PRIMARY KEY,
    tenant                  TEXT    NOT NULL,
    content                 TEXT    NOT NULL,
    -- Lower-case, single-spaced, without closing punctuation: the dedup key.
    content_norm            TEXT    NOT NULL,
    -- The question the fact answers, and the sha256 of its normalized form.
    question                TEXT,
    question_hash           TEXT,
    confidence              REAL    NOT NULL CHECK (confidence > 0 AND confidence <= 1),
    source_type             TEXT    NOT NULL CHECK (source_type IN ('inference', 'user_provided', 'deduced')),
    provenance_inference_id INTEGER REFERENCES inferences (id),
    -- How often the fact was stated again or served since it was created.
    reuse_count             INTEGER NOT NULL DEFAULT 0,
    last_reused_at          TEXT,
    created_at              TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    -- A fact is live while degraded_at is NULL.
    degraded_at             TEXT,
    degraded_by             INTEGER REFERENCES facts (id),
    degradation_reason      TEXT,
    CHECK ((degraded_at IS NULL) = (degradation_reason IS NULL))
);
CREATE INDEX facts_live_content ON facts (tenant, content_norm) WHERE degraded_at IS NULL;
CREATE INDEX facts_live_question ON facts (tenant, question_hash) WHERE degraded_at IS NULL;

-- Edges of the fact graph.
--   implies:     a claim of an answer → that answer's conclusion (its last claim)
--   supports:    a user-provided fact → a model fact about the same question with the same content
--   supersedes:  a user-provided fact → an older fact about the same question that it replaced
--   contradicts: a fact named in InvalidateFacts(contradicted_by) → each fact it degraded
CREATE TABLE fact_relationships (
    id           INTEGER PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    from_fact_id INTEGER NOT NULL REFERENCES facts (id),
    to_fact_id   INTEGER NOT NULL REFERENCES facts (id),
    kind         TEXT    NOT NULL CHECK (kind IN ('implies', 'contradicts', 'supports', 'supersedes')),
    inference_id INTEGER REFERENCES inferences (id),
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (from_fact_id, to_fact_id, kind)
);
CREATE INDEX fact_relationships_to ON fact_relationships (to_fact_id);

-- The ordered claims an answer to a prompt consisted of, ending in its result.
CREATE TABLE reasoning_chains (
    id             INTEGER PRIMARY KEY,
    tenant         TEXT    NOT NULL,
    prompt_hash    TEXT    NOT NULL,
    -- The answer the chain was first extracted from.
    inference_id   INTEGER NOT NULL REFERENCES inferences (id),
    -- JSON array of fact ids in answer order.
    fact_ids       TEXT    NOT NULL,
    result_fact_id INTEGER NOT NULL REFERENCES facts (id),
    -- Times the chain was produced again or replayed from the exact cache.
    reuse_count    INTEGER NOT NULL DEFAULT 0,
    created_at     TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_reused_at TEXT,
    UNIQUE (tenant, prompt_hash, fact_ids)
);
CREATE INDEX reasoning_chains_inference ON reasoning_chains (inference_id);

-- KV-cache prefixes and where they came from (filled by the KV-reuse work).
CREATE TABLE kv_lineage (
    id           INTEGER PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    model_id     TEXT    NOT NULL,
    -- sha256 of the prefix's token ids.
    prefix_hash  TEXT    NOT NULL,
    token_count  INTEGER NOT NULL,
    parent_id    INTEGER REFERENCES kv_lineage (id),
    inference_id INTEGER REFERENCES inferences (id),
    reuse_count  INTEGER NOT NULL DEFAULT 0,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_used_at TEXT,
    UNIQUE (tenant, model_id, prefix_hash)
);

-- Embedded pieces of text for semantic lookups (filled by the semantic-cache work).
-- `embedding` is float32 little-endian, sqlite-vec's format: vec_distance_cosine(embedding, ?).
CREATE TABLE semantic_fragments (
    id              INTEGER PRIMARY KEY,
    tenant          TEXT    NOT NULL,
    inference_id    INTEGER REFERENCES inferences (id),
    fact_id         INTEGER REFERENCES facts (id),
    text            TEXT    NOT NULL,
    embedding_model TEXT    NOT NULL,
    embedding       BLOB    NOT NULL,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX semantic_fragments_tenant ON semantic_fragments (tenant);

-- Requests per tenant and tier; `share` is the tier's fraction of the tenant's requests
-- (for EXACT and FACT: that tier's hit rate; for MODEL: the miss rate).
CREATE VIEW v_hit_rates AS
SELECT tenant,
       served_from,
       COUNT(*)                                                        AS requests,
       ROUND(1.0 * COUNT(*) / SUM(COUNT(*)) OVER (PARTITION BY tenant), 4) AS share,
       SUM(tokens_computed)                                            AS tokens_computed,
       SUM(tokens_reused)                                              AS tokens_reused,
       ROUND(AVG(latency_ms), 3)                                       AS avg_latency_ms
FROM inferences
GROUP BY tenant, served_from;

-- The last 100 requests, newest first.
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
       ROUND(latency_ms, 3)                  AS latency_ms,
       source_inference_id,
       substr(COALESCE(question, prompt), 1, 80) AS question,
       substr(response, 1, 80)               AS response
FROM inferences
ORDER BY id DESC
LIMIT 100;

-- Facts not degraded.
CREATE VIEW v_live_facts AS
SELECT id, tenant, content, question, confidence, source_type, reuse_count, provenance_inference_id, created_at
FROM facts
WHERE degraded_at IS NULL;
