//! The shared knowledge store: PostgreSQL + pgvector (`--db postgres://...`), for several
//! replicas behind a load balancer. Same tables, columns and views as the SQLite store
//! (`migrations/postgres/NNNN_*.sql` mirror `migrations/NNNN_*.sql` one for one), same methods,
//! same tenant filter on every query.
//!
//! * Client: rust-postgres' synchronous `postgres::Client` (tokio-postgres underneath), one
//!   connection behind a mutex, like the SQLite store's; calls block and run off the async
//!   workers, as the SQLite ones do.
//! * Lost connection: a call whose connection fails (server gone, socket closed) returns
//!   [`StoreError::Unavailable`] (gRPC UNAVAILABLE, HTTP 503) and drops the client; the next call
//!   connects again. Nothing is served from a stale copy: the exact cache's moka L1 holds only
//!   answers that were already in the database.
//! * Concurrency between replicas: every write is one transaction; fact writes of a tenant
//!   (`learn`, `put_fact`, `invalidate_facts`) take a per-tenant transaction advisory lock, so two
//!   replicas stating the same claim at once strengthen one row instead of adding two, and no
//!   strengthening is lost; chains and edges are upserts on their unique keys; a fact vector is
//!   stored once (`fact_id` unique, `ON CONFLICT DO NOTHING`).
//! * Migrations run under a session advisory lock, so replicas starting together migrate once;
//!   the version is the row count of `forge_schema_migrations` (`migrate.rs`).
//!
//! Files: this one (connection, writes and request-path reads), `migrate.rs` (the schema),
//! `read.rs` (`stats`, the semantic evidence, `sql`'s read-only statements).

mod migrate;
mod read;

use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pgvector::Vector;
use postgres::{Client, NoTls, Transaction};

use super::claims::{normalize, split_claims};
use super::facts::{
    checked_fact, checked_invalidation, question_hash, Fact, InvalidateRequest, LearnReport, PutFactReport, INFERENCE_CONFIDENCE, MAX_MODEL_CONFIDENCE,
    REPEAT_GAIN,
};
use super::inferences::{token_ids, CachedAnswer, NewInference};
use super::parse_stop_reason;
use super::model_files::{fingerprint, ModelIdentity};
use super::semantic::{floats, EquivalenceObservation, Neighbour, Outcome};
use super::blob;
use super::StoreError;
use crate::vocab::{CacheMode, ServedFrom};

pub use migrate::PG_MIGRATIONS;
use migrate::migrate;

/// How long a (re)connection may take before the request fails as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

const FACT_COLUMNS: &str = "id, content, question, confidence, source_type, created_at, provenance_inference_id, \
                            reuse_count, degraded_at IS NULL, degraded_by, degradation_reason";

/// True for a URL this backend takes (`postgres://` or `postgresql://`).
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let cred = &url[s + 3..at];
            match cred.split_once(':') {
                Some((user, _)) => format!("{}{}:***{}", &url[..s + 3], user, &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

fn fact_from_row(r: &postgres::Row) -> Result<Fact, StoreError> {
    Ok(Fact {
        id: r.try_get(0)?,
        content: r.try_get(1)?,
        question: r.try_get(2)?,
        confidence: r.try_get(3)?,
        source_type: r.try_get(4)?,
        created_at: r.try_get(5)?,
        provenance_inference_id: r.try_get(6)?,
        reuse_count: r.try_get(7)?,
        live: r.try_get(8)?,
        degraded_by: r.try_get(9)?,
        degradation_reason: r.try_get(10)?,
    })
}

/// A connection-level failure (no server answer): the database is unavailable.
fn is_connection_error(e: &postgres::Error) -> bool {
    e.is_closed() || (e.as_db_error().is_none() && e.code().is_none())
}

/// The read-write (or, for `stats`/`sql`, read-only) store on one PostgreSQL database.
pub struct PgStore {
    config: postgres::Config,
    url: String,
    read_only: bool,
    client: Mutex<Option<Client>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &redact(&self.url)).finish()
    }
}

impl PgStore {
    /// Connects to `url` and applies pending migrations (creating the `vector` extension the
    /// first time: the user needs the right to). Fails when the server cannot be reached.
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        let store = PgStore::connect(url, false)?;
        store.with(migrate)?;
        Ok(store)
    }

    /// Connects for reading only (every transaction READ ONLY); the schema must be current.
    pub fn open_read_only(url: &str) -> Result<PgStore, StoreError> {
        let store = PgStore::connect(url, true)?;
        let v = store.schema_version()?;
        if v == 0 {
            return Err(StoreError::Invalid(format!("{} has no forge-cache schema (start `forge-cache serve --db URL` first)", redact(url))));
        }
        Ok(store)
    }

    fn connect(url: &str, read_only: bool) -> Result<PgStore, StoreError> {
        let mut config = postgres::Config::from_str(url).map_err(|e| StoreError::Invalid(format!("{}: not a PostgreSQL URL: {e}", redact(url))))?;
        config.connect_timeout(CONNECT_TIMEOUT);
        config.application_name("forge-cache");
        if read_only {
            config.options("-c default_transaction_read_only=on");
        }
        let store = PgStore { config, url: url.to_string(), read_only, client: Mutex::new(None) };
        drop(store.client()?);
        Ok(store)
    }

    /// The URL this store was opened with (password hidden).
    pub fn url(&self) -> String {
        redact(&self.url)
    }

    fn client(&self) -> Result<MutexGuard<'_, Option<Client>>, StoreError> {
        let mut guard = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_some_and(|c| c.is_closed()) {
            *guard = None;
        }
        if guard.is_none() {
            let client = self.config.connect(NoTls).map_err(|e| StoreError::Unavailable(format!("{}: {e}", redact(&self.url))))?;
            *guard = Some(client);
        }
        Ok(guard)
    }

    /// Another connection to the same database, for the same use (the shared KV tier moves
    /// megabytes per request through its own, so they never queue behind the store's writes).
    pub fn another_connection(&self) -> Result<PgStore, StoreError> {
        PgStore::connect(&self.url, self.read_only)
    }

    /// Runs `f` on the connection (connecting first when needed). A connection-level failure
    /// drops the client (the next call reconnects) and comes back as [`StoreError::Unavailable`].
    /// (Crate-visible for the shared KV tier, `workload::shared`, which keeps its SQL beside it
    /// as the SQLite disk tier does.)
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Client) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let mut guard = self.client()?;
        let Some(client) = guard.as_mut() else {
            return Err(StoreError::Unavailable(redact(&self.url)));
        };
        match f(client) {
            Err(StoreError::Postgres(e)) if is_connection_error(&e) || client.is_closed() => {
                *guard = None;
                Err(StoreError::Unavailable(format!("{}: {e}", redact(&self.url))))
            }
            other => other,
        }
    }

    /// Runs `f` in one transaction (committed when it returns Ok).
    pub(crate) fn tx<T>(&self, f: impl FnOnce(&mut Transaction<'_>) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.with(|c| {
            let mut tx = c.transaction()?;
            let out = f(&mut tx)?;
            tx.commit()?;
            Ok(out)
        })
    }

    /// The schema version: migrations applied.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.with(|c| {
            let exists: bool = c.query_one("SELECT to_regclass('forge_schema_migrations') IS NOT NULL", &[])?.get(0);
            if !exists {
                return Ok(0);
            }
            Ok(c.query_one("SELECT COUNT(*) FROM forge_schema_migrations", &[])?.get(0))
        })
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    // ---- inferences and the exact cache ----

    pub fn record_inference(&self, r: &NewInference<'_>) -> Result<i64, StoreError> {
        let tokens = serde_json::to_string(r.response_tokens).map_err(|e| StoreError::Malformed(e.to_string()))?;
        let n = |v: usize| v as i64;
        // The same float32 little-endian bytes as the SQLite store's BLOB.
        let logprobs: Option<Vec<u8>> = r.response_logprobs.map(blob);
        let prompt_ids = r.prompt_token_ids.map(serde_json::to_string).transpose().map_err(|e| StoreError::Malformed(e.to_string()))?;
        self.tx(|tx| {
            let id: i64 = tx
                .query_one(
                    "INSERT INTO inferences (tenant, question, prompt, prompt_hash, model, model_id, params, cache_mode,
                         cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
                         completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens,
                         queue_ms, prefill_ms, decode_ms, latency_ms, backend, ttft_ms, kv_tokens_reused, draft_tokens,
                         draft_accepted, candidates_tried, response_logprobs, equivalence_mean, equivalence_worst, equivalence_checks,
                         prompt_token_ids)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                         $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32, $33, $34, $35)
                     RETURNING id",
                    &[
                        &r.tenant, &r.question, &r.prompt, &r.prompt_hash, &r.model, &r.model_id, &r.params,
                        &r.cache_mode.as_str(), &r.cache_key, &r.served_from.as_str(), &r.source_inference_id,
                        &r.source_fact_id, &r.similarity, &n(r.prompt_tokens), &n(r.completion_tokens),
                        &n(r.tokens_computed), &n(r.tokens_reused), &r.stop_reason.as_str(), &r.response, &tokens,
                        &r.queue_ms, &r.prefill_ms, &r.decode_ms, &r.latency_ms, &r.backend, &r.ttft_ms,
                        &n(r.kv_tokens_reused), &n(r.draft_tokens), &n(r.draft_accepted), &n(r.candidates_tried),
                        &logprobs, &r.equivalence_mean, &r.equivalence_worst, &n(r.equivalence_checks), &prompt_ids,
                    ],
                )?
                .get(0);
            match (r.served_from, r.cache_mode, r.cache_key) {
                (ServedFrom::Model, CacheMode::Refresh, Some(key)) => {
                    tx.execute(
                        "UPDATE inferences SET superseded_by = $1
                         WHERE tenant = $2 AND cache_key = $3 AND served_from IN ('MODEL', 'VERIFIED', 'PARTIAL') AND superseded_by IS NULL AND id != $1",
                        &[&id, &r.tenant, &key],
                    )?;
                }
                (ServedFrom::Exact, _, _) => {
                    tx.execute(
                        "UPDATE reasoning_chains SET reuse_count = reuse_count + 1, last_reused_at = forge_now() WHERE tenant = $1 AND inference_id = $2",
                        &[&r.tenant, &r.source_inference_id],
                    )?;
                }
                (ServedFrom::Fact, _, _) => {
                    tx.execute(
                        "UPDATE facts SET reuse_count = reuse_count + 1, last_reused_at = forge_now() WHERE tenant = $1 AND id = $2",
                        &[&r.tenant, &r.source_fact_id],
                    )?;
                }
                _ => {}
            }
            Ok(id)
        })
    }

    pub fn find_exact(&self, tenant: &str, key: &str) -> Result<Option<CachedAnswer>, StoreError> {
        let row = self.with(|c| {
            Ok(c.query_opt(
                "SELECT id, response, response_tokens, stop_reason, tokens_computed, prompt_token_ids FROM inferences
                 WHERE tenant = $1 AND cache_key = $2 AND served_from IN ('MODEL', 'VERIFIED', 'PARTIAL') AND superseded_by IS NULL
                   AND stop_reason != 'cancelled'
                 ORDER BY id DESC LIMIT 1",
                &[&tenant, &key],
            )?)
        })?;
        let Some(row) = row else { return Ok(None) };
        let inference_id: i64 = row.try_get(0)?;
        let tokens: String = row.try_get(2)?;
        let computed: i64 = row.try_get(4)?;
        let prompt_ids: Option<String> = row.try_get(5)?;
        Ok(Some(CachedAnswer {
            inference_id,
            response: row.try_get(1)?,
            response_tokens: token_ids(inference_id, "response_tokens", &tokens)?,
            stop_reason: parse_stop_reason(row.try_get(3)?)?,
            tokens_computed: computed.max(0) as usize,
            prompt_token_ids: prompt_ids.map(|ids| token_ids(inference_id, "prompt_token_ids", &ids)).transpose()?,
        }))
    }

    // ---- facts ----

    pub fn learn(&self, tenant: &str, inference_id: i64, question: Option<&str>, prompt_hash: &str, answer: &str) -> Result<LearnReport, StoreError> {
        let claims = split_claims(answer);
        let mut report = LearnReport::default();
        if claims.is_empty() {
            return Ok(report);
        }
        let qhash = question.map(question_hash);
        self.tx(|tx| {
            lock_tenant_facts(tx, tenant)?;
            for claim in &claims {
                let norm = normalize(claim);
                let existing = tx.query_opt(
                    "SELECT id, degraded_at IS NULL FROM facts WHERE tenant = $1 AND content_norm = $2
                     ORDER BY degraded_at IS NULL DESC, id DESC LIMIT 1",
                    &[&tenant, &norm],
                )?;
                match existing.map(|r| (r.get::<_, i64>(0), r.get::<_, bool>(1))) {
                    Some((id, true)) => {
                        strengthen(tx, id)?;
                        report.strengthened += 1;
                        report.fact_ids.push(id);
                    }
                    Some((_, false)) => report.degraded_repeats += 1,
                    None => {
                        let id: i64 = tx
                            .query_one(
                                "INSERT INTO facts (tenant, content, content_norm, question, question_hash, confidence, source_type,
                                     provenance_inference_id)
                                 VALUES ($1, $2, $3, $4, $5, $6, 'inference', $7) RETURNING id",
                                &[&tenant, claim, &norm, &question, &qhash, &INFERENCE_CONFIDENCE, &inference_id],
                            )?
                            .get(0);
                        report.added += 1;
                        report.fact_ids.push(id);
                    }
                }
            }
            if let Some((&result, premises)) = report.fact_ids.split_last() {
                let ids = serde_json::to_string(&report.fact_ids).map_err(|e| StoreError::Malformed(e.to_string()))?;
                let chain: i64 = tx
                    .query_one(
                        "INSERT INTO reasoning_chains (tenant, prompt_hash, inference_id, fact_ids, result_fact_id)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (tenant, prompt_hash, fact_ids) DO UPDATE SET
                             reuse_count = reasoning_chains.reuse_count + 1, last_reused_at = forge_now(), inference_id = excluded.inference_id
                         RETURNING id",
                        &[&tenant, &prompt_hash, &inference_id, &ids, &result],
                    )?
                    .get(0);
                report.chain_id = Some(chain);
                for &premise in premises {
                    add_edge(tx, tenant, premise, result, "implies", Some(inference_id))?;
                }
            }
            Ok(())
        })?;
        Ok(report)
    }

    pub fn put_fact(&self, tenant: &str, content: &str, question: Option<&str>, confidence: f64) -> Result<PutFactReport, StoreError> {
        let (content, question) = checked_fact(content, question, confidence)?;
        let norm = normalize(content);
        let qhash = question.map(question_hash);
        self.tx(|tx| {
            lock_tenant_facts(tx, tenant)?;
            let same = tx.query_opt(
                "SELECT id FROM facts WHERE tenant = $1 AND content_norm = $2 AND question_hash IS NOT DISTINCT FROM $3
                   AND source_type = 'user_provided' AND degraded_at IS NULL",
                &[&tenant, &norm, &qhash],
            )?;
            if let Some(row) = same {
                let id: i64 = row.get(0);
                tx.execute(
                    "UPDATE facts SET confidence = GREATEST(confidence, $2), reuse_count = reuse_count + 1, last_reused_at = forge_now() WHERE id = $1",
                    &[&id, &confidence],
                )?;
                return Ok(PutFactReport { fact: get_fact(tx, tenant, id)?, superseded: Vec::new() });
            }
            let id: i64 = tx
                .query_one(
                    "INSERT INTO facts (tenant, content, content_norm, question, question_hash, confidence, source_type)
                     VALUES ($1, $2, $3, $4, $5, $6, 'user_provided') RETURNING id",
                    &[&tenant, &content, &norm, &question, &qhash, &confidence],
                )?
                .get(0);
            let mut superseded = Vec::new();
            if let Some(qhash) = &qhash {
                let about = tx.query(
                    "SELECT id, content_norm FROM facts WHERE tenant = $1 AND question_hash = $2 AND degraded_at IS NULL AND id != $3",
                    &[&tenant, qhash, &id],
                )?;
                for row in about {
                    let (old, old_norm): (i64, String) = (row.get(0), row.get(1));
                    if old_norm == norm {
                        add_edge(tx, tenant, id, old, "supports", None)?;
                    } else {
                        degrade(tx, tenant, old, Some(id), &format!("superseded by user-provided fact #{id}"))?;
                        add_edge(tx, tenant, id, old, "supersedes", None)?;
                        superseded.push(old);
                    }
                }
            }
            Ok(PutFactReport { fact: get_fact(tx, tenant, id)?, superseded })
        })
    }

    pub fn invalidate_facts(&self, tenant: &str, req: &InvalidateRequest<'_>) -> Result<Vec<i64>, StoreError> {
        let (reason, text) = checked_invalidation(req)?;
        self.tx(|tx| {
            lock_tenant_facts(tx, tenant)?;
            if let Some(by) = req.contradicted_by {
                if !get_fact(tx, tenant, by)?.live {
                    return Err(StoreError::Invalid(format!("fact {by} is degraded and cannot contradict others")));
                }
            }
            let mut targets = Vec::new();
            for &id in req.ids {
                if get_fact(tx, tenant, id)?.live && !targets.contains(&id) {
                    targets.push(id);
                }
            }
            if let Some(text) = text {
                let rows = tx.query(
                    "SELECT id FROM facts WHERE tenant = $1 AND degraded_at IS NULL AND strpos(lower(content), lower($2)) > 0 ORDER BY id",
                    &[&tenant, &text],
                )?;
                targets.extend(rows.iter().map(|r| r.get::<_, i64>(0)).filter(|id| !req.ids.contains(id)));
            }
            targets.retain(|&id| Some(id) != req.contradicted_by);
            for &id in &targets {
                degrade(tx, tenant, id, req.contradicted_by, reason)?;
                if let Some(by) = req.contradicted_by {
                    add_edge(tx, tenant, by, id, "contradicts", None)?;
                }
            }
            Ok(targets)
        })
    }

    pub fn search_facts(&self, tenant: &str, query: &str, limit: usize, include_degraded: bool) -> Result<Vec<Fact>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query(
                &format!(
                    "SELECT {FACT_COLUMNS} FROM facts
                     WHERE tenant = $1 AND ($2 = '' OR strpos(lower(content), lower($2)) > 0) AND ($3 OR degraded_at IS NULL)
                     ORDER BY degraded_at IS NULL DESC, confidence DESC, id DESC LIMIT $4"
                ),
                &[&tenant, &query.trim(), &include_degraded, &(limit as i64)],
            )?)
        })?;
        rows.iter().map(fact_from_row).collect()
    }

    pub fn fact_answer(&self, tenant: &str, question: &str) -> Result<Option<Fact>, StoreError> {
        let row = self.with(|c| {
            Ok(c.query_opt(
                &format!(
                    "SELECT {FACT_COLUMNS} FROM facts
                     WHERE tenant = $1 AND question_hash = $2 AND source_type = 'user_provided' AND degraded_at IS NULL
                     ORDER BY id DESC LIMIT 1"
                ),
                &[&tenant, &question_hash(question)],
            )?)
        })?;
        row.as_ref().map(fact_from_row).transpose()
    }

    // ---- semantic tier ----

    pub fn index_prompt(&self, tenant: &str, scope: &str, inference_id: i64, embedding: &[f32]) -> Result<(), StoreError> {
        let v = Vector::from(embedding.to_vec());
        self.with(|c| {
            c.execute("INSERT INTO prompt_vectors (scope, embedding, inference_id, tenant) VALUES ($1, $2, $3, $4)", &[&scope, &v, &inference_id, &tenant])?;
            Ok(())
        })
    }

    pub fn index_fact(&self, tenant: &str, fact_id: i64, embedding: &[f32]) -> Result<(), StoreError> {
        let v = Vector::from(embedding.to_vec());
        self.with(|c| {
            c.execute("INSERT INTO fact_vectors (tenant, embedding, fact_id) VALUES ($1, $2, $3) ON CONFLICT (fact_id) DO NOTHING", &[&tenant, &v, &fact_id])?;
            Ok(())
        })
    }

    /// The `k` nearest questions in `scope` (cosine, pgvector), then their answers as the SQLite
    /// store gives them (cancelled and superseded ones skipped, a similarity floor).
    pub fn nearest_answers(&self, scope: &str, embedding: &[f32], k: usize, min_similarity: f64) -> Result<Vec<Neighbour>, StoreError> {
        let v = Vector::from(embedding.to_vec());
        let rows = self.with(|c| {
            Ok(c.query(
                "WITH near AS (
                     SELECT inference_id, (embedding <=> $1)::float8 AS distance FROM prompt_vectors
                     WHERE scope = $2 ORDER BY embedding <=> $1 LIMIT $3)
                 SELECT n.inference_id, n.distance, i.response, i.response_tokens, i.stop_reason, i.params, i.response_logprobs
                 FROM near n JOIN inferences i ON i.id = n.inference_id
                 WHERE i.stop_reason != 'cancelled' AND i.superseded_by IS NULL
                 ORDER BY n.distance, n.inference_id",
                &[&v, &scope, &(k as i64)],
            )?)
        })?;
        let mut out = Vec::new();
        for r in rows {
            let inference_id: i64 = r.try_get(0)?;
            let distance: f64 = r.try_get(1)?;
            let similarity = 1.0 - distance;
            if similarity < min_similarity {
                continue;
            }
            let tokens: String = r.try_get(3)?;
            let params: String = r.try_get(5)?;
            let response_tokens: Vec<u32> =
                serde_json::from_str(&tokens).map_err(|e| StoreError::Malformed(format!("inference {inference_id} response_tokens: {e}")))?;
            let max_tokens = serde_json::from_str::<serde_json::Value>(&params)
                .ok()
                .and_then(|p| p.get("max_tokens").and_then(|m| m.as_u64()))
                .unwrap_or(0) as usize;
            let logprobs = r.try_get::<_, Option<Vec<u8>>>(6)?.as_deref().and_then(floats);
            out.push(Neighbour {
                inference_id,
                similarity,
                response: r.try_get(2)?,
                response_tokens,
                stop_reason: parse_stop_reason(r.try_get(4)?)?,
                max_tokens,
                logprobs,
            });
        }
        Ok(out)
    }

    pub fn record_outcome(&self, tenant: &str, model_id: &str, inference_id: i64, o: &Outcome, draft: usize, accepted: usize) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO semantic_outcomes (tenant, model_id, inference_id, source_inference_id, similarity, draft_tokens, accepted_tokens, correct)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[&tenant, &model_id, &inference_id, &o.source_inference_id, &o.similarity, &(draft as i64), &(accepted as i64), &(o.correct as i64)],
            )?;
            Ok(())
        })
    }

    pub fn outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<Outcome>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query(
                "SELECT source_inference_id, similarity, correct FROM semantic_outcomes WHERE tenant = $1 AND model_id = $2 ORDER BY id",
                &[&tenant, &model_id],
            )?)
        })?;
        rows.iter()
            .map(|r| Ok(Outcome { source_inference_id: r.try_get(0)?, similarity: r.try_get(1)?, correct: r.try_get::<_, i64>(2)? != 0 }))
            .collect()
    }

    /// Facts of `tenant` that have no vector yet (any replica may index them; a fact's vector is
    /// stored once).
    pub fn unindexed_facts(&self, tenant: &str, limit: usize) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query(
                "SELECT f.id, f.content FROM facts f WHERE f.tenant = $1
                   AND NOT EXISTS (SELECT 1 FROM fact_vectors v WHERE v.fact_id = f.id) ORDER BY f.id LIMIT $2",
                &[&tenant, &(limit as i64)],
            )?)
        })?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    pub fn tenants_with_unindexed_facts(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query("SELECT DISTINCT f.tenant FROM facts f WHERE NOT EXISTS (SELECT 1 FROM fact_vectors v WHERE v.fact_id = f.id) ORDER BY 1", &[])?)
        })?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    pub fn lowest_wrong_similarity(&self, source_inference_id: i64) -> Result<Option<f64>, StoreError> {
        self.with(|c| Ok(c.query_one("SELECT MIN(similarity) FROM semantic_outcomes WHERE source_inference_id = $1 AND correct = 0", &[&source_inference_id])?.get(0)))
    }

    /// (similarity, draft tokens fed, accepted) of every verified check of `tenant` and model.
    pub fn draft_outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<(f64, u64, u64)>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query(
                "SELECT similarity, draft_tokens, accepted_tokens FROM semantic_outcomes WHERE tenant = $1 AND model_id = $2 ORDER BY id",
                &[&tenant, &model_id],
            )?)
        })?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get::<_, i64>(1)?.max(0) as u64, r.try_get::<_, i64>(2)?.max(0) as u64))).collect()
    }

    /// Records what exploring an EQUIVALENT candidate for inference `inference_id` found.
    pub fn record_equivalence(&self, tenant: &str, model_id: &str, inference_id: i64, o: &EquivalenceObservation) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO equivalence_outcomes (tenant, model_id, inference_id, source_inference_id, similarity,
                     mean_margin, worst_margin, candidate_ll, fresh_ll, acceptable)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &[
                    &tenant,
                    &model_id,
                    &inference_id,
                    &o.source_inference_id,
                    &o.similarity,
                    &o.mean_margin,
                    &o.worst_margin,
                    &o.candidate_ll,
                    &o.fresh_ll,
                    &(o.acceptable as i64),
                ],
            )?;
            Ok(())
        })
    }

    /// Every explored EQUIVALENT candidate of `tenant` and model, oldest first (every replica's:
    /// the region one replica learns is the one all of them serve from).
    pub fn equivalence_observations(&self, tenant: &str, model_id: &str) -> Result<Vec<EquivalenceObservation>, StoreError> {
        let rows = self.with(|c| {
            Ok(c.query(
                "SELECT source_inference_id, similarity, mean_margin, worst_margin, candidate_ll, fresh_ll, acceptable
                 FROM equivalence_outcomes WHERE tenant = $1 AND model_id = $2 ORDER BY id",
                &[&tenant, &model_id],
            )?)
        })?;
        rows.iter()
            .map(|r| {
                Ok(EquivalenceObservation {
                    source_inference_id: r.try_get(0)?,
                    similarity: r.try_get(1)?,
                    mean_margin: r.try_get(2)?,
                    worst_margin: r.try_get(3)?,
                    candidate_ll: r.try_get(4)?,
                    fresh_ll: r.try_get(5)?,
                    acceptable: r.try_get::<_, i64>(6)? != 0,
                })
            })
            .collect()
    }

    // ---- model files ----

    /// The SHA-256 of the model file at `path`, as the SQLite store's `model_identity`: looked
    /// up by the file's fingerprint (size, modification time, first 4 MiB) in `model_files`,
    /// else computed and remembered. The table is shared, so a replica whose copy of the model
    /// has the same fingerprint as one already hashed (same size, mtime and header, e.g. one
    /// image or one shared volume) skips the full read too; a copy with another mtime is hashed
    /// once on its own. Two replicas hashing at once both write the same row (upsert).
    pub fn model_identity(&self, path: &std::path::Path) -> Result<ModelIdentity, StoreError> {
        let io = |e: std::io::Error| StoreError::Invalid(format!("reading the model file {}: {e}", path.display()));
        let fp = fingerprint(path).map_err(io)?;
        let known = self.with(|c| Ok(c.query_opt("SELECT sha256 FROM model_files WHERE fingerprint = $1", &[&fp.key])?))?;
        if let Some(row) = known {
            return Ok(ModelIdentity { sha256: row.try_get(0)?, hashed_now: false });
        }
        let t0 = std::time::Instant::now();
        let sha256 = super::sha256_file(path).map_err(io)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let shown = path.to_string_lossy().into_owned();
        self.with(|c| {
            c.execute(
                "INSERT INTO model_files (fingerprint, path, size_bytes, modified_ns, sha256, hash_ms) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (fingerprint) DO UPDATE SET path = EXCLUDED.path, size_bytes = EXCLUDED.size_bytes,
                     modified_ns = EXCLUDED.modified_ns, sha256 = EXCLUDED.sha256, hash_ms = EXCLUDED.hash_ms, hashed_at = forge_now()",
                &[&fp.key, &shown, &(fp.size as i64), &fp.modified_ns, &sha256, &ms],
            )?;
            Ok(())
        })?;
        Ok(ModelIdentity { sha256, hashed_now: true })
    }

}

/// Serializes the fact writes of one tenant across replicas until the transaction ends.
fn lock_tenant_facts(tx: &mut Transaction<'_>, tenant: &str) -> Result<(), StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock(hashtextextended('forge-facts:' || $1, 0))", &[&tenant])?;
    Ok(())
}

fn get_fact(tx: &mut Transaction<'_>, tenant: &str, id: i64) -> Result<Fact, StoreError> {
    let row = tx.query_opt(&format!("SELECT {FACT_COLUMNS} FROM facts WHERE tenant = $1 AND id = $2"), &[&tenant, &id])?;
    row.as_ref().map(fact_from_row).transpose()?.ok_or(StoreError::NoSuchFact(id))
}

fn add_edge(tx: &mut Transaction<'_>, tenant: &str, from: i64, to: i64, kind: &str, inference: Option<i64>) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO fact_relationships (tenant, from_fact_id, to_fact_id, kind, inference_id) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (from_fact_id, to_fact_id, kind) DO NOTHING",
        &[&tenant, &from, &to, &kind, &inference],
    )?;
    Ok(())
}

fn degrade(tx: &mut Transaction<'_>, tenant: &str, id: i64, by: Option<i64>, reason: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE facts SET degraded_at = forge_now(), degraded_by = $3, degradation_reason = $4 WHERE tenant = $1 AND id = $2 AND degraded_at IS NULL",
        &[&tenant, &id, &by, &reason],
    )?;
    Ok(())
}

fn strengthen(tx: &mut Transaction<'_>, id: i64) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE facts SET confidence = GREATEST(confidence, LEAST($2, confidence + (1.0 - confidence) * $3)),
             reuse_count = reuse_count + 1, last_reused_at = forge_now() WHERE id = $1",
        &[&id, &MAX_MODEL_CONFIDENCE, &REPEAT_GAIN],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_recognised_and_passwords_hidden() {
        assert!(is_postgres_url("postgres://u@h/db") && is_postgres_url("postgresql://h/db"));
        assert!(!is_postgres_url("forge.db") && !is_postgres_url("/tmp/postgres.db"));
        assert_eq!(redact("postgres://u:secret@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
    }
}
