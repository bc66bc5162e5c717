-- 0003: the semantic cache. sqlite-vec `vec0` tables hold MiniLM embeddings (384 floats,
-- cosine distance = 1 - cosine similarity); KNN runs inside one partition, so a lookup never
-- sees another tenant's (or another model's, or another system prompt's) rows.

-- One row per computed answer (MODEL, VERIFIED, PARTIAL) of a single-question chat request.
-- `scope` = sha256 of (tenant, model id, the prompt rendered with the question left out): only
-- requests that differ in the question alone are neighbours. The embedded text is the question.
CREATE VIRTUAL TABLE prompt_vectors USING vec0(
    scope        TEXT PARTITION KEY,
    embedding    float[384] distance_metric=cosine,
    +inference_id INTEGER,
    +tenant       TEXT
);

-- Every fact's content, per tenant (nearest facts: `WHERE embedding MATCH ? AND k = 5 AND tenant = ?`).
CREATE VIRTUAL TABLE fact_vectors USING vec0(
    tenant       TEXT PARTITION KEY,
    embedding    float[384] distance_metric=cosine,
    +fact_id      INTEGER
);

-- What verification found out about a neighbour's answer: the evidence TRUST decisions learn
-- from. `correct` = 1 when the nearest neighbour's answer was exactly the model's answer (every
-- token and the stop accepted).
CREATE TABLE semantic_outcomes (
    id                  INTEGER PRIMARY KEY,
    created_at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    tenant              TEXT    NOT NULL,
    model_id            TEXT    NOT NULL,
    -- The request whose answer checked the draft, and the inference the draft came from.
    inference_id        INTEGER NOT NULL REFERENCES inferences (id),
    source_inference_id INTEGER NOT NULL REFERENCES inferences (id),
    similarity          REAL    NOT NULL,
    draft_tokens        INTEGER NOT NULL,
    accepted_tokens     INTEGER NOT NULL,
    correct             INTEGER NOT NULL CHECK (correct IN (0, 1))
);
CREATE INDEX semantic_outcomes_tenant ON semantic_outcomes (tenant, model_id);
CREATE INDEX semantic_outcomes_source ON semantic_outcomes (source_inference_id);

-- Semantic reuse per tenant: verified/partial/trust hits, draft acceptance, and the false-hit
-- estimate of TRUST (the error rate verification measured above the similarity TRUST serves at
-- is in `forge-cache stats`; this view gives the raw counts).
CREATE VIEW v_semantic AS
SELECT tenant,
       SUM(served_from = 'VERIFIED')                                   AS verified,
       SUM(served_from = 'PARTIAL')                                    AS partial,
       SUM(served_from = 'TRUST')                                      AS trusted,
       COUNT(*)                                                        AS requests,
       SUM(draft_tokens)                                               AS draft_tokens,
       SUM(draft_accepted)                                             AS draft_accepted,
       ROUND(1.0 * SUM(draft_accepted) / MAX(SUM(draft_tokens), 1), 4) AS acceptance
FROM inferences
GROUP BY tenant;
