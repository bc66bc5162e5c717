//! Facts and the graph around them.
//!
//! * [`SqliteStore::learn`] runs after every computed answer: the answer's claims become facts of the
//!   tenant (a claim that is already a live fact strengthens it instead of adding a row; one that
//!   matches only a degraded fact is not revived), the ordered claims are recorded as a
//!   reasoning chain ending in the last claim, and each earlier claim `implies` that result.
//! * [`SqliteStore::put_fact`] adds a user-provided fact. With a question, it supersedes the live facts
//!   about that question (degraded, `degraded_by` = the new fact, reason kept, nothing deleted);
//!   a model fact with the same content is `supported` instead.
//! * [`SqliteStore::invalidate_facts`] degrades facts by id or by text match, optionally naming the
//!   fact that `contradicts` them.
//! * [`SqliteStore::fact_answer`]: the live user-provided fact that answers a question (the FACT tier).

use rusqlite::{named_params, OptionalExtension, Row, Transaction};

use super::claims::{normalize, split_claims, MAX_CLAIM_BYTES};
use super::{now_sql, sha256_hex, SqliteStore, StoreError};

/// Confidence of a claim the model stated once.
pub const INFERENCE_CONFIDENCE: f64 = 0.5;
/// Each repeat closes this fraction of the gap to certainty (noisy-OR), up to [`MAX_MODEL_CONFIDENCE`].
pub const REPEAT_GAIN: f64 = 0.5;
/// Model facts never become certain by repetition alone.
pub const MAX_MODEL_CONFIDENCE: f64 = 0.99;
/// Longest user-provided fact or question accepted.
pub const MAX_FACT_BYTES: usize = 4 * MAX_CLAIM_BYTES;

/// A fact as the API shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Fact {
    /// Row id in `facts`.
    pub id: i64,
    /// The claim's text.
    pub content: String,
    /// The question the fact answers, when known.
    pub question: Option<String>,
    /// In (0, 1].
    pub confidence: f64,
    /// `inference`, `user_provided` or `deduced`.
    pub source_type: String,
    /// When it was created (UTC, ISO 8601 from the store).
    pub created_at: String,
    /// The inference whose answer it was extracted from.
    pub provenance_inference_id: Option<i64>,
    /// How often the fact was stated again or served since it was created.
    pub reuse_count: i64,
    /// Not degraded.
    pub live: bool,
    /// The fact that showed it wrong or superseded it, if any.
    pub degraded_by: Option<i64>,
    /// Why it was degraded (None while live).
    pub degradation_reason: Option<String>,
}

const FACT_COLUMNS: &str = "id, content, question, confidence, source_type, created_at, provenance_inference_id, \
                            reuse_count, degraded_at IS NULL, degraded_by, degradation_reason";

fn fact_from_row(r: &Row<'_>) -> rusqlite::Result<Fact> {
    Ok(Fact {
        id: r.get(0)?,
        content: r.get(1)?,
        question: r.get(2)?,
        confidence: r.get(3)?,
        source_type: r.get(4)?,
        created_at: r.get(5)?,
        provenance_inference_id: r.get(6)?,
        reuse_count: r.get(7)?,
        live: r.get(8)?,
        degraded_by: r.get(9)?,
        degradation_reason: r.get(10)?,
    })
}

/// What [`SqliteStore::learn`] did with an answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LearnReport {
    /// The chain's facts, in answer order.
    pub fact_ids: Vec<i64>,
    /// Claims stored as new facts.
    pub added: usize,
    /// Claims that restate a live fact (that fact's reuse count is bumped).
    pub strengthened: usize,
    /// Claims that restate a degraded fact (left degraded, not in the chain).
    pub degraded_repeats: usize,
    /// The `reasoning_chains` row of the chain (None when no claim made it into the chain).
    pub chain_id: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PutFactReport {
    /// The fact as stored (new, or the same user-provided fact strengthened).
    pub fact: Fact,
    /// Live facts about the same question with other content, degraded by this one.
    pub superseded: Vec<i64>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct InvalidateRequest<'a> {
    /// Facts to degrade, by id.
    pub ids: &'a [i64],
    /// Degrade the live facts whose content contains this (case-insensitive).
    pub text_match: Option<&'a str>,
    /// Why (required, recorded as each fact's `degradation_reason`).
    pub reason: &'a str,
    /// A live fact that shows the others wrong: recorded as `degraded_by` and `contradicts` edges.
    pub contradicted_by: Option<i64>,
}

/// The key facts are filed under for a question: sha256 of its normalized text.
pub fn question_hash(question: &str) -> String {
    sha256_hex(normalize(question).as_bytes())
}

/// PutFact's input, trimmed and checked (both backends): (content, question).
pub(crate) fn checked_fact<'a>(content: &'a str, question: Option<&'a str>, confidence: f64) -> Result<(&'a str, Option<&'a str>), StoreError> {
    let content = content.trim();
    let question = question.map(str::trim).filter(|q| !q.is_empty());
    if content.is_empty() {
        return Err(StoreError::Invalid("the fact's content is empty".into()));
    }
    if content.len() > MAX_FACT_BYTES || question.is_some_and(|q| q.len() > MAX_FACT_BYTES) {
        return Err(StoreError::Invalid(format!("facts and questions are limited to {MAX_FACT_BYTES} bytes")));
    }
    if !(confidence > 0.0 && confidence <= 1.0) {
        return Err(StoreError::Invalid(format!("confidence must be in (0, 1], got {confidence}")));
    }
    Ok((content, question))
}

/// InvalidateFacts' input, checked (both backends): (reason, text to match).
pub(crate) fn checked_invalidation<'a>(req: &InvalidateRequest<'a>) -> Result<(&'a str, Option<&'a str>), StoreError> {
    let reason = req.reason.trim();
    if reason.is_empty() {
        return Err(StoreError::Invalid("a reason is required to invalidate facts".into()));
    }
    let text = req.text_match.map(str::trim).filter(|t| !t.is_empty());
    if req.ids.is_empty() && text.is_none() {
        return Err(StoreError::Invalid("name facts by ids or by text_match".into()));
    }
    Ok((reason, text))
}

fn get_fact(tx: &Transaction<'_>, tenant: &str, id: i64) -> Result<Fact, StoreError> {
    tx.query_row(&format!("SELECT {FACT_COLUMNS} FROM facts WHERE tenant = ?1 AND id = ?2"), rusqlite::params![tenant, id], fact_from_row)
        .optional()?
        .ok_or(StoreError::NoSuchFact(id))
}

fn add_edge(tx: &Transaction<'_>, tenant: &str, from: i64, to: i64, kind: &str, inference: Option<i64>) -> Result<(), StoreError> {
    tx.execute(
        "INSERT OR IGNORE INTO fact_relationships (tenant, from_fact_id, to_fact_id, kind, inference_id) VALUES (?1, ?2, ?3, ?4, ?5)",
        rusqlite::params![tenant, from, to, kind, inference],
    )?;
    Ok(())
}

fn degrade(tx: &Transaction<'_>, tenant: &str, id: i64, by: Option<i64>, reason: &str) -> Result<(), StoreError> {
    tx.execute(
        concat!(
            "UPDATE facts SET degraded_at = ",
            now_sql!(),
            ", degraded_by = ?3, degradation_reason = ?4 WHERE tenant = ?1 AND id = ?2 AND degraded_at IS NULL"
        ),
        rusqlite::params![tenant, id, by, reason],
    )?;
    Ok(())
}

/// Confidence after one more independent statement of the fact (never lowered).
fn strengthen(tx: &Transaction<'_>, id: i64) -> Result<(), StoreError> {
    tx.execute(
        concat!(
            "UPDATE facts SET confidence = MAX(confidence, MIN(?2, confidence + (1.0 - confidence) * ?3)),
                 reuse_count = reuse_count + 1, last_reused_at = ",
            now_sql!(),
            " WHERE id = ?1"
        ),
        rusqlite::params![id, MAX_MODEL_CONFIDENCE, REPEAT_GAIN],
    )?;
    Ok(())
}

impl SqliteStore {
    /// Extracts the claims of a computed answer into the tenant's facts and records its chain.
    pub fn learn(
        &self,
        tenant: &str,
        inference_id: i64,
        question: Option<&str>,
        prompt_hash: &str,
        answer: &str,
    ) -> Result<LearnReport, StoreError> {
        let claims = split_claims(answer);
        let mut report = LearnReport::default();
        if claims.is_empty() {
            return Ok(report);
        }
        let qhash = question.map(question_hash);
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        for claim in &claims {
            let norm = normalize(claim);
            let existing: Option<(i64, bool)> = tx
                .query_row(
                    "SELECT id, degraded_at IS NULL FROM facts WHERE tenant = ?1 AND content_norm = ?2
                     ORDER BY degraded_at IS NULL DESC, id DESC LIMIT 1",
                    rusqlite::params![tenant, norm],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            match existing {
                Some((id, true)) => {
                    strengthen(&tx, id)?;
                    report.strengthened += 1;
                    report.fact_ids.push(id);
                }
                Some((_, false)) => report.degraded_repeats += 1,
                None => {
                    tx.execute(
                        "INSERT INTO facts (tenant, content, content_norm, question, question_hash, confidence, source_type,
                             provenance_inference_id)
                         VALUES (:tenant, :content, :norm, :question, :qhash, :confidence, 'inference', :inference)",
                        named_params! {
                            ":tenant": tenant, ":content": claim, ":norm": norm, ":question": question,
                            ":qhash": qhash, ":confidence": INFERENCE_CONFIDENCE, ":inference": inference_id,
                        },
                    )?;
                    report.added += 1;
                    report.fact_ids.push(tx.last_insert_rowid());
                }
            }
        }
        if let Some((&result, premises)) = report.fact_ids.split_last() {
            let ids = serde_json::to_string(&report.fact_ids).map_err(|e| StoreError::Malformed(e.to_string()))?;
            let chain: i64 = tx.query_row(
                concat!(
                    "INSERT INTO reasoning_chains (tenant, prompt_hash, inference_id, fact_ids, result_fact_id)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (tenant, prompt_hash, fact_ids) DO UPDATE SET
                         reuse_count = reuse_count + 1, last_reused_at = ",
                    now_sql!(),
                    ", inference_id = excluded.inference_id
                     RETURNING id"
                ),
                rusqlite::params![tenant, prompt_hash, inference_id, ids, result],
                |r| r.get(0),
            )?;
            report.chain_id = Some(chain);
            for &premise in premises {
                add_edge(&tx, tenant, premise, result, "implies", Some(inference_id))?;
            }
        }
        tx.commit()?;
        Ok(report)
    }

    /// Adds a user-provided fact (see the module docs). Stating a live user-provided fact again
    /// (same content and question) strengthens it instead of adding a row.
    pub fn put_fact(&self, tenant: &str, content: &str, question: Option<&str>, confidence: f64) -> Result<PutFactReport, StoreError> {
        let (content, question) = checked_fact(content, question, confidence)?;
        let norm = normalize(content);
        let qhash = question.map(question_hash);
        // A user's write is acknowledged only once it would survive a power loss.
        let mut conn = self.durable_conn()?;
        let tx = conn.transaction()?;
        let same: Option<i64> = tx
            .query_row(
                "SELECT id FROM facts WHERE tenant = ?1 AND content_norm = ?2 AND question_hash IS ?3
                   AND source_type = 'user_provided' AND degraded_at IS NULL",
                rusqlite::params![tenant, norm, qhash],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = same {
            tx.execute(
                concat!("UPDATE facts SET confidence = MAX(confidence, ?2), reuse_count = reuse_count + 1, last_reused_at = ", now_sql!(), " WHERE id = ?1"),
                rusqlite::params![id, confidence],
            )?;
            let fact = get_fact(&tx, tenant, id)?;
            tx.commit()?;
            return Ok(PutFactReport { fact, superseded: Vec::new() });
        }
        tx.execute(
            "INSERT INTO facts (tenant, content, content_norm, question, question_hash, confidence, source_type)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'user_provided')",
            rusqlite::params![tenant, content, norm, question, qhash, confidence],
        )?;
        let id = tx.last_insert_rowid();
        let mut superseded = Vec::new();
        if let Some(qhash) = &qhash {
            let about: Vec<(i64, String)> = tx
                .prepare("SELECT id, content_norm FROM facts WHERE tenant = ?1 AND question_hash = ?2 AND degraded_at IS NULL AND id != ?3")?
                .query_map(rusqlite::params![tenant, qhash, id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            for (old, old_norm) in about {
                if old_norm == norm {
                    add_edge(&tx, tenant, id, old, "supports", None)?;
                } else {
                    degrade(&tx, tenant, old, Some(id), &format!("superseded by user-provided fact #{id}"))?;
                    add_edge(&tx, tenant, id, old, "supersedes", None)?;
                    superseded.push(old);
                }
            }
        }
        let fact = get_fact(&tx, tenant, id)?;
        tx.commit()?;
        Ok(PutFactReport { fact, superseded })
    }

    /// Degrades the live facts named by id or matched by text; returns the ids degraded now.
    /// An id that is not a fact of this tenant is an error (and nothing changes).
    pub fn invalidate_facts(&self, tenant: &str, req: &InvalidateRequest<'_>) -> Result<Vec<i64>, StoreError> {
        let (reason, text) = checked_invalidation(req)?;
        let mut conn = self.durable_conn()?;
        let tx = conn.transaction()?;
        if let Some(by) = req.contradicted_by {
            if !get_fact(&tx, tenant, by)?.live {
                return Err(StoreError::Invalid(format!("fact {by} is degraded and cannot contradict others")));
            }
        }
        let mut targets = Vec::new();
        for &id in req.ids {
            if get_fact(&tx, tenant, id)?.live && !targets.contains(&id) {
                targets.push(id);
            }
        }
        if let Some(text) = text {
            let matched: Vec<i64> = tx
                .prepare("SELECT id FROM facts WHERE tenant = ?1 AND degraded_at IS NULL AND instr(lower(content), lower(?2)) > 0 ORDER BY id")?
                .query_map(rusqlite::params![tenant, text], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            targets.extend(matched.into_iter().filter(|id| !req.ids.contains(id)));
        }
        targets.retain(|&id| Some(id) != req.contradicted_by);
        for &id in &targets {
            degrade(&tx, tenant, id, req.contradicted_by, reason)?;
            if let Some(by) = req.contradicted_by {
                add_edge(&tx, tenant, by, id, "contradicts", None)?;
            }
        }
        tx.commit()?;
        Ok(targets)
    }

    /// The tenant's facts whose content contains `query` (case-insensitive; empty = all), live
    /// ones first, then by confidence.
    pub fn search_facts(&self, tenant: &str, query: &str, limit: usize, include_degraded: bool) -> Result<Vec<Fact>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {FACT_COLUMNS} FROM facts
             WHERE tenant = ?1 AND (?2 = '' OR instr(lower(content), lower(?2)) > 0) AND (?3 OR degraded_at IS NULL)
             ORDER BY degraded_at IS NULL DESC, confidence DESC, id DESC LIMIT ?4"
        ))?;
        let rows = stmt.query_map(rusqlite::params![tenant, query.trim(), include_degraded, limit as i64], fact_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The newest live user-provided fact filed under `question` (normalized), if any.
    pub fn fact_answer(&self, tenant: &str, question: &str) -> Result<Option<Fact>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {FACT_COLUMNS} FROM facts
             WHERE tenant = ?1 AND question_hash = ?2 AND source_type = 'user_provided' AND degraded_at IS NULL
             ORDER BY id DESC LIMIT 1"
        ))?;
        Ok(stmt.query_row(rusqlite::params![tenant, question_hash(question)], fact_from_row).optional()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path().join("f.db")).expect("open");
        (dir, store)
    }

    fn synchronous(store: &SqliteStore) -> i64 {
        store.conn().query_row("PRAGMA synchronous", [], |r| r.get(0)).expect("pragma")
    }

    #[test]
    fn user_writes_commit_at_synchronous_full_and_the_rest_at_normal() {
        let (_dir, store) = store();
        assert_eq!(synchronous(&store), 1, "NORMAL by default");
        {
            let conn = store.durable_conn().expect("durable");
            let level: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).expect("pragma");
            assert_eq!(level, 2, "FULL while a user's write runs");
        }
        assert_eq!(synchronous(&store), 1, "back to NORMAL");
        store.put_fact("t", "Paris is the capital of France.", Some("capital of France?"), 1.0).expect("put");
        let req = InvalidateRequest { ids: &[], text_match: Some("Paris"), reason: "test", contradicted_by: None };
        assert_eq!(store.invalidate_facts("t", &req).expect("invalidate").len(), 1);
        assert_eq!(synchronous(&store), 1);
    }

    fn inference(store: &SqliteStore, tenant: &str) -> i64 {
        use crate::store::{inferences::tests::sample, CacheMode, ServedFrom};
        store.record_inference(&sample(tenant, None, ServedFrom::Model, CacheMode::Auto)).expect("record")
    }

    const Q: &str = "What is the capital of France?";
    const A: &str = "The capital of France is Paris. Paris is a large city.";

    #[test]
    fn learning_dedups_strengthens_and_chains() {
        let (_d, s) = store();
        let i1 = inference(&s, "t");
        let r1 = s.learn("t", i1, Some(Q), "ph", A).expect("learn");
        assert_eq!((r1.added, r1.strengthened, r1.fact_ids.len()), (2, 0, 2));
        let i2 = inference(&s, "t");
        let r2 = s.learn("t", i2, Some(Q), "ph", A).expect("learn");
        assert_eq!((r2.added, r2.strengthened), (0, 2));
        assert_eq!((r2.fact_ids.clone(), r2.chain_id), (r1.fact_ids.clone(), r1.chain_id));
        let facts = s.search_facts("t", "", 10, false).expect("search");
        assert_eq!(facts.len(), 2);
        assert!(facts.iter().all(|f| f.confidence == 0.75 && f.reuse_count == 1 && f.provenance_inference_id == Some(i1)));
        let (reuse, inf): (i64, i64) =
            s.conn().query_row("SELECT reuse_count, inference_id FROM reasoning_chains", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("chain");
        assert_eq!((reuse, inf), (1, i2));
        let implies: i64 = s.conn().query_row("SELECT count(*) FROM fact_relationships WHERE kind = 'implies'", [], |r| r.get(0)).expect("n");
        assert_eq!(implies, 1);
        // Another tenant starts from nothing.
        let i3 = inference(&s, "u");
        assert_eq!(s.learn("u", i3, Some(Q), "ph", A).expect("learn").added, 2);
    }

    #[test]
    fn put_fact_supersedes_and_serves_the_question() {
        let (_d, s) = store();
        let i = inference(&s, "t");
        let learned = s.learn("t", i, Some(Q), "ph", "The capital of France is Lyon. The capital of France is Paris.").expect("learn");
        assert_eq!(s.fact_answer("t", Q).expect("lookup"), None, "model facts do not answer questions");
        let put = s.put_fact("t", "The capital of France is Paris.", Some(Q), 1.0).expect("put");
        assert_eq!(put.superseded, vec![learned.fact_ids[0]]);
        let all = s.search_facts("t", "capital", 10, true).expect("search");
        let lyon = all.iter().find(|f| f.content.contains("Lyon")).expect("kept, degraded");
        assert!(!lyon.live && lyon.degraded_by == Some(put.fact.id));
        assert!(lyon.degradation_reason.as_deref().is_some_and(|r| r.contains("superseded")));
        assert!(all.iter().any(|f| f.id == learned.fact_ids[1] && f.live), "the equal model fact is supported, not degraded");
        // Questions match after normalization; other tenants see nothing.
        assert_eq!(s.fact_answer("t", "what is the capital of france").expect("lookup").map(|f| f.id), Some(put.fact.id));
        assert_eq!(s.fact_answer("u", Q).expect("lookup"), None);
        // Saying it again adds no row.
        assert_eq!(s.put_fact("t", "The capital of France is Paris", Some(Q), 1.0).expect("again").fact.id, put.fact.id);
    }

    #[test]
    fn invalidate_by_id_and_text_with_contradiction() {
        let (_d, s) = store();
        let i = inference(&s, "t");
        let ids = s.learn("t", i, None, "ph", "The moon is made of cheese. Cows can fly over it. Water is wet today.").expect("learn").fact_ids;
        let truth = s.put_fact("t", "The moon is made of rock.", None, 1.0).expect("put").fact.id;
        let req = InvalidateRequest { ids: &ids[..1], text_match: Some("COWS"), reason: "nonsense", contradicted_by: Some(truth) };
        assert_eq!(s.invalidate_facts("t", &req).expect("invalidate"), vec![ids[0], ids[1]]);
        let live: Vec<i64> = s.search_facts("t", "", 10, false).expect("search").iter().map(|f| f.id).collect();
        assert_eq!(live, vec![truth, ids[2]]);
        let contradicts: i64 =
            s.conn().query_row("SELECT count(*) FROM fact_relationships WHERE kind = 'contradicts'", [], |r| r.get(0)).expect("n");
        assert_eq!(contradicts, 2);
        // A restated degraded claim is not revived.
        let again = s.learn("t", i, None, "ph2", "The moon is made of cheese.").expect("learn");
        assert_eq!((again.added, again.degraded_repeats), (0, 1));
        // Errors: another tenant's id, no reason, nothing named.
        let other = InvalidateRequest { ids: &ids[2..], reason: "x", ..Default::default() };
        assert!(matches!(s.invalidate_facts("u", &other), Err(StoreError::NoSuchFact(_))));
        assert!(matches!(s.invalidate_facts("t", &InvalidateRequest { ids: &ids, ..Default::default() }), Err(StoreError::Invalid(_))));
        assert!(matches!(s.invalidate_facts("t", &InvalidateRequest { reason: "x", ..Default::default() }), Err(StoreError::Invalid(_))));
    }
}
