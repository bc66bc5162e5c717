//! The semantic cache's tables: prompt embeddings per scope and fact embeddings per tenant
//! (sqlite-vec `vec0`, cosine distance), nearest-neighbour lookups, and the outcomes of verified
//! checks that TRUST decisions learn from.

use rusqlite::{params, OptionalExtension};

use super::{blob, parse_stop_reason, SqliteStore, StoreError};
use crate::vocab::StopReason;

/// An earlier answer whose prompt is near a new one.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    /// The earlier answer's row in `inferences`.
    pub inference_id: i64,
    /// Cosine similarity of the two questions' embeddings.
    pub similarity: f64,
    /// The earlier answer's text.
    pub response: String,
    /// The earlier answer's token ids.
    pub response_tokens: Vec<u32>,
    /// Why the earlier answer stopped.
    pub stop_reason: StopReason,
    /// The `max_tokens` the answer was generated with.
    pub max_tokens: usize,
    /// log p of each answer token (and the stop token when it ended on one) under its own
    /// prompt, when recorded (`inferences.response_logprobs`).
    pub logprobs: Option<Vec<f32>>,
}

/// One explored EQUIVALENT candidate (`equivalence_outcomes`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EquivalenceObservation {
    /// The candidate answer's row in `inferences`.
    pub source_inference_id: i64,
    /// Cosine similarity of the two questions' embeddings.
    pub similarity: f64,
    /// Mean per-token log-probability margin, new prompt minus own.
    pub mean_margin: f64,
    /// The smallest of those per-token margins.
    pub worst_margin: f64,
    /// Mean log-probability per token of the candidate under the new prompt.
    pub candidate_ll: f64,
    /// Mean log-probability per token of the freshly computed answer (over the scored prefix).
    pub fresh_ll: f64,
    /// The label-free judgement under the margin of the run that recorded it.
    pub acceptable: bool,
}

/// float32 little-endian bytes back into values (`None`: not a whole number of floats).
pub(crate) fn floats(b: &[u8]) -> Option<Vec<f32>> {
    (b.len() % 4 == 0).then(|| b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// One verification of a nearest neighbour's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// The neighbour's row in `inferences`.
    pub source_inference_id: i64,
    /// Cosine similarity of the two questions' embeddings.
    pub similarity: f64,
    /// The neighbour's answer was exactly right.
    pub correct: bool,
}

impl SqliteStore {
    /// Files a computed answer's question embedding under `scope`.
    pub fn index_prompt(&self, tenant: &str, scope: &str, inference_id: i64, embedding: &[f32]) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO prompt_vectors (scope, embedding, inference_id, tenant) VALUES (?1, ?2, ?3, ?4)",
            params![scope, blob(embedding), inference_id, tenant],
        )?;
        Ok(())
    }

    /// Files a fact's embedding.
    pub fn index_fact(&self, tenant: &str, fact_id: i64, embedding: &[f32]) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO fact_vectors (tenant, embedding, fact_id) VALUES (?1, ?2, ?3)",
            params![tenant, blob(embedding), fact_id],
        )?;
        Ok(())
    }

    /// The `k` answers in `scope` whose questions are nearest `embedding`, most similar first,
    /// skipping answers that are cancelled or superseded and those below `min_similarity`.
    pub fn nearest_answers(&self, scope: &str, embedding: &[f32], k: usize, min_similarity: f64) -> Result<Vec<Neighbour>, StoreError> {
        let conn = self.conn();
        let mut knn = conn.prepare_cached(
            "SELECT inference_id, distance FROM prompt_vectors WHERE embedding MATCH ?1 AND k = ?2 AND scope = ?3 ORDER BY distance",
        )?;
        let mut near: Vec<(i64, f64)> =
            knn.query_map(params![blob(embedding), k as i64, scope], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
        near.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let mut answer = conn.prepare_cached(
            "SELECT response, response_tokens, stop_reason, params, response_logprobs FROM inferences
             WHERE id = ?1 AND stop_reason != 'cancelled' AND superseded_by IS NULL",
        )?;
        let mut rows = Vec::new();
        for (id, distance) in near {
            let row = answer
                .query_row([id], |r| {
                    Ok((id, distance, r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?, r.get::<_, Option<Vec<u8>>>(4)?))
                })
                .optional()?;
            rows.extend(row.map(Ok::<_, StoreError>));
        }
        let mut out = Vec::new();
        for row in rows {
            let (inference_id, distance, response, tokens, stop, params, logprobs) = row?;
            let similarity = 1.0 - distance;
            if similarity < min_similarity {
                continue;
            }
            let response_tokens: Vec<u32> = serde_json::from_str(&tokens)
                .map_err(|e| StoreError::Malformed(format!("inference {inference_id} response_tokens: {e}")))?;
            let max_tokens = serde_json::from_str::<serde_json::Value>(&params)
                .ok()
                .and_then(|p| p.get("max_tokens").and_then(|m| m.as_u64()))
                .unwrap_or(0) as usize;
            let logprobs = logprobs.as_deref().and_then(floats);
            out.push(Neighbour { inference_id, similarity, response, response_tokens, stop_reason: parse_stop_reason(&stop)?, max_tokens, logprobs });
        }
        Ok(out)
    }

    /// Records what checking `source`'s answer for inference `inference_id` found.
    pub fn record_outcome(&self, tenant: &str, model_id: &str, inference_id: i64, o: &Outcome, draft: usize, accepted: usize) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO semantic_outcomes (tenant, model_id, inference_id, source_inference_id, similarity,
                 draft_tokens, accepted_tokens, correct)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![tenant, model_id, inference_id, o.source_inference_id, o.similarity, draft as i64, accepted as i64, o.correct],
        )?;
        Ok(())
    }

    /// Every recorded outcome of `tenant` and model, oldest first.
    pub fn outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<Outcome>, StoreError> {
        let conn = self.conn();
        let mut q = conn.prepare_cached(
            "SELECT source_inference_id, similarity, correct FROM semantic_outcomes
             WHERE tenant = ?1 AND model_id = ?2 ORDER BY id",
        )?;
        let rows = q.query_map(params![tenant, model_id], |r| Ok(Outcome { source_inference_id: r.get(0)?, similarity: r.get(1)?, correct: r.get(2)? }))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// (similarity, draft tokens fed, accepted) of every verified check of `tenant` and model.
    pub fn draft_outcomes(&self, tenant: &str, model_id: &str) -> Result<Vec<(f64, u64, u64)>, StoreError> {
        let conn = self.conn();
        let mut q = conn.prepare_cached(
            "SELECT similarity, draft_tokens, accepted_tokens FROM semantic_outcomes WHERE tenant = ?1 AND model_id = ?2 ORDER BY id",
        )?;
        let rows = q.query_map(params![tenant, model_id], |r| Ok((r.get::<_, f64>(0)?, r.get::<_, i64>(1)?.max(0) as u64, r.get::<_, i64>(2)?.max(0) as u64)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records what exploring an EQUIVALENT candidate for inference `inference_id` found.
    pub fn record_equivalence(&self, tenant: &str, model_id: &str, inference_id: i64, o: &EquivalenceObservation) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO equivalence_outcomes (tenant, model_id, inference_id, source_inference_id, similarity,
                 mean_margin, worst_margin, candidate_ll, fresh_ll, acceptable)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                tenant,
                model_id,
                inference_id,
                o.source_inference_id,
                o.similarity,
                o.mean_margin,
                o.worst_margin,
                o.candidate_ll,
                o.fresh_ll,
                o.acceptable
            ],
        )?;
        Ok(())
    }

    /// Every explored EQUIVALENT candidate of `tenant` and model, oldest first.
    pub fn equivalence_observations(&self, tenant: &str, model_id: &str) -> Result<Vec<EquivalenceObservation>, StoreError> {
        let conn = self.conn();
        let mut q = conn.prepare_cached(
            "SELECT source_inference_id, similarity, mean_margin, worst_margin, candidate_ll, fresh_ll, acceptable
             FROM equivalence_outcomes WHERE tenant = ?1 AND model_id = ?2 ORDER BY id",
        )?;
        let rows = q.query_map(params![tenant, model_id], |r| {
            Ok(EquivalenceObservation {
                source_inference_id: r.get(0)?,
                similarity: r.get(1)?,
                mean_margin: r.get(2)?,
                worst_margin: r.get(3)?,
                candidate_ll: r.get(4)?,
                fresh_ll: r.get(5)?,
                acceptable: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Facts of `tenant` with no embedding yet (newer than the newest embedded one), oldest first.
    pub fn unindexed_facts(&self, tenant: &str, limit: usize) -> Result<Vec<(i64, String)>, StoreError> {
        let conn = self.conn();
        let newest: i64 = conn.query_row("SELECT COALESCE(MAX(fact_id), 0) FROM fact_vectors WHERE tenant = ?1", [tenant], |r| r.get(0))?;
        let mut q = conn.prepare_cached("SELECT id, content FROM facts WHERE tenant = ?1 AND id > ?2 ORDER BY id LIMIT ?3")?;
        let rows = q.query_map(params![tenant, newest, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Tenants with facts that have no embedding yet.
    pub fn tenants_with_unindexed_facts(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut q = conn.prepare(
            "SELECT DISTINCT f.tenant FROM facts f
             WHERE f.id > (SELECT COALESCE(MAX(v.fact_id), 0) FROM fact_vectors v WHERE v.tenant = f.tenant)",
        )?;
        let rows = q.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The lowest similarity at which `source`'s answer was found wrong for another question.
    pub fn lowest_wrong_similarity(&self, source_inference_id: i64) -> Result<Option<f64>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT MIN(similarity) FROM semantic_outcomes WHERE source_inference_id = ?1 AND correct = 0",
                [source_inference_id],
                |r| r.get::<_, Option<f64>>(0),
            )
            .optional()?
            .flatten())
    }
}

/// The raw evidence of semantic reuse, per tenant: draft tokens offered and accepted, and every
/// verification outcome (similarity, exactly right), oldest first. The statistics on top of it
/// (TRUST's threshold, its error bound) are the cache tier's (`cache::trust::semantic_stats`).
#[derive(Debug, Clone, Default)]
pub struct SemanticEvidence {
    /// Tenant → (draft tokens offered, draft tokens accepted).
    pub drafts: std::collections::BTreeMap<String, (u64, u64)>,
    /// Tenant → (similarity, correct) of every verified neighbour check.
    pub outcomes: std::collections::BTreeMap<String, Vec<(f64, bool)>>,
}

/// Reads the evidence of one tenant (or of all).
pub fn evidence(conn: &rusqlite::Connection, tenant: Option<&str>) -> Result<SemanticEvidence, StoreError> {
    let mut ev = SemanticEvidence::default();
    let mut q = conn.prepare("SELECT tenant, SUM(draft_tokens), SUM(draft_accepted) FROM inferences WHERE ?1 IS NULL OR tenant = ?1 GROUP BY tenant")?;
    for row in q.query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))? {
        let (t, d, a) = row?;
        ev.drafts.insert(t, (d.max(0) as u64, a.max(0) as u64));
    }
    let mut q = conn.prepare("SELECT tenant, similarity, correct FROM semantic_outcomes WHERE ?1 IS NULL OR tenant = ?1 ORDER BY id")?;
    for row in q.query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?, r.get::<_, bool>(2)?)))? {
        let (t, sim, ok) = row?;
        ev.outcomes.entry(t).or_default().push((sim, ok));
    }
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::inferences::tests::sample;
    use crate::store::{CacheMode, ServedFrom};

    fn unit(dim: usize, hot: &[(usize, f32)]) -> Vec<f32> {
        let mut v = vec![0f32; dim];
        for &(i, x) in hot {
            v[i] = x;
        }
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn neighbours_stay_in_their_scope_and_come_nearest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path().join("s.db")).expect("open");
        let a = store.record_inference(&sample("t", Some("k1"), ServedFrom::Model, CacheMode::Auto)).expect("record");
        let b = store.record_inference(&sample("t", Some("k2"), ServedFrom::Model, CacheMode::Auto)).expect("record");
        let other = store.record_inference(&sample("u", Some("k3"), ServedFrom::Model, CacheMode::Auto)).expect("record");
        store.index_prompt("t", "scope-t", a, &unit(384, &[(0, 1.0)])).expect("index");
        store.index_prompt("t", "scope-t", b, &unit(384, &[(0, 1.0), (1, 1.0)])).expect("index");
        store.index_prompt("u", "scope-u", other, &unit(384, &[(0, 1.0)])).expect("index");

        let q = unit(384, &[(0, 1.0), (1, 0.1)]);
        let near = store.nearest_answers("scope-t", &q, 5, 0.0).expect("knn");
        assert_eq!(near.iter().map(|n| n.inference_id).collect::<Vec<_>>(), vec![a, b]);
        assert!(near[0].similarity > 0.99 && near[1].similarity < near[0].similarity, "{near:?}");
        assert_eq!(near[0].response, "Paris.");
        assert_eq!(near[0].response_tokens, vec![1, 2, 3]);
        assert_eq!(near[0].logprobs, Some(vec![-0.5, -0.25, -0.125, -1.0]));
        // The other tenant's identical vector is never a neighbour; a floor drops the far one.
        let near = store.nearest_answers("scope-t", &q, 5, 0.9).expect("knn");
        assert_eq!(near.len(), 1);
        assert!(store.nearest_answers("scope-none", &q, 5, 0.0).expect("knn").is_empty());

        let o = Outcome { source_inference_id: a, similarity: 0.93, correct: false };
        store.record_outcome("t", "mid", b, &o, 10, 2).expect("outcome");
        assert_eq!(store.outcomes("t", "mid").expect("outcomes"), vec![o]);
        assert!(store.outcomes("u", "mid").expect("outcomes").is_empty());
        assert_eq!(store.lowest_wrong_similarity(a).expect("min"), Some(0.93));
        assert_eq!(store.lowest_wrong_similarity(b).expect("min"), None);
        assert_eq!(store.draft_outcomes("t", "mid").expect("drafts"), vec![(0.93, 10, 2)]);
        let e = EquivalenceObservation {
            source_inference_id: a,
            similarity: 0.9,
            mean_margin: -0.2,
            worst_margin: -1.5,
            candidate_ll: -0.8,
            fresh_ll: -0.6,
            acceptable: false,
        };
        store.record_equivalence("t", "mid", b, &e).expect("equivalence");
        assert_eq!(store.equivalence_observations("t", "mid").expect("read"), vec![e]);
        assert!(store.equivalence_observations("u", "mid").expect("read").is_empty());
        store.index_fact("t", 1, &q).expect("fact vector");

        // Facts without embeddings are found per tenant until they are indexed.
        store.learn("u", other, Some("What is the capital of France?"), "h", "The capital of France is Paris.").expect("learn");
        assert_eq!(store.tenants_with_unindexed_facts().expect("tenants"), vec!["u".to_string()]);
        for (id, _) in store.unindexed_facts("u", 100).expect("unindexed") {
            store.index_fact("u", id, &q).expect("fact vector");
        }
        assert!(store.tenants_with_unindexed_facts().expect("tenants").is_empty());
    }
}
