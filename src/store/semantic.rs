//! The semantic cache's tables: prompt embeddings per scope and fact embeddings per tenant
//! (sqlite-vec `vec0`, cosine distance), nearest-neighbour lookups, and the outcomes of verified
//! checks that TRUST decisions learn from.

use rusqlite::{params, OptionalExtension};

use super::inferences::parse_stop_reason;
use super::{SqliteStore, StoreError};
use crate::vocab::StopReason;

/// An earlier answer whose prompt is near a new one.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbour {
    pub inference_id: i64,
    /// Cosine similarity of the two questions' embeddings.
    pub similarity: f64,
    pub response: String,
    pub response_tokens: Vec<u32>,
    pub stop_reason: StopReason,
    /// The `max_tokens` the answer was generated with.
    pub max_tokens: usize,
}

/// One verification of a nearest neighbour's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub source_inference_id: i64,
    pub similarity: f64,
    pub correct: bool,
}

/// Little-endian f32 bytes: sqlite-vec's vector format.
fn blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
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
            "SELECT response, response_tokens, stop_reason, params FROM inferences
             WHERE id = ?1 AND stop_reason != 'cancelled' AND superseded_by IS NULL",
        )?;
        let mut rows = Vec::new();
        for (id, distance) in near {
            let row = answer
                .query_row([id], |r| Ok((id, distance, r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?)))
                .optional()?;
            rows.extend(row.map(Ok::<_, StoreError>));
        }
        let mut out = Vec::new();
        for row in rows {
            let (inference_id, distance, response, tokens, stop, params) = row?;
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
            out.push(Neighbour { inference_id, similarity, response, response_tokens, stop_reason: parse_stop_reason(&stop)?, max_tokens });
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

/// Semantic reuse of one tenant (or all, `*`), for `forge-cache stats`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SemanticStats {
    pub tenant: String,
    pub draft_tokens: u64,
    pub draft_accepted: u64,
    /// Verifications of a nearest neighbour's answer, and how many found it exactly right.
    pub checks: u64,
    pub checks_correct: u64,
    /// TRUST under the given parameters: the similarity it serves from (None: not enough
    /// evidence), the outcomes at or above it, the wrong ones among them, and the Wilson upper
    /// bound of the false-hit rate there.
    pub trust_threshold: Option<f64>,
    pub trust_outcomes: u64,
    pub trust_wrong: u64,
    pub trust_false_hit_bound: Option<f64>,
}

/// Per tenant (sorted), then `*` when no tenant was asked for and there are several.
pub fn stats(conn: &rusqlite::Connection, tenant: Option<&str>, p: &crate::cache::trust::TrustParams) -> Result<Vec<SemanticStats>, StoreError> {
    let mut drafts: std::collections::BTreeMap<String, (u64, u64)> = std::collections::BTreeMap::new();
    let mut q = conn.prepare("SELECT tenant, SUM(draft_tokens), SUM(draft_accepted) FROM inferences WHERE ?1 IS NULL OR tenant = ?1 GROUP BY tenant")?;
    for row in q.query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))? {
        let (t, d, a) = row?;
        drafts.insert(t, (d.max(0) as u64, a.max(0) as u64));
    }
    let mut outcomes: std::collections::BTreeMap<String, Vec<(f64, bool)>> = std::collections::BTreeMap::new();
    let mut q = conn.prepare("SELECT tenant, similarity, correct FROM semantic_outcomes WHERE ?1 IS NULL OR tenant = ?1 ORDER BY id")?;
    for row in q.query_map([tenant], |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?, r.get::<_, bool>(2)?)))? {
        let (t, sim, ok) = row?;
        outcomes.entry(t).or_default().push((sim, ok));
    }
    Ok(build_stats(drafts, outcomes, tenant, p))
}

/// [`SemanticStats`] from per-tenant (draft tokens, accepted) and outcomes (similarity,
/// correct), in order; either backend reads those.
pub(crate) fn build_stats(
    drafts: std::collections::BTreeMap<String, (u64, u64)>,
    outcomes: std::collections::BTreeMap<String, Vec<(f64, bool)>>,
    tenant: Option<&str>,
    p: &crate::cache::trust::TrustParams,
) -> Vec<SemanticStats> {
    use crate::cache::trust::{fit_threshold, wilson_upper};
    let build = |name: String, d: (u64, u64), o: &[(f64, bool)]| {
        let threshold = fit_threshold(o, p);
        let above: Vec<&(f64, bool)> = threshold.map(|t| o.iter().filter(|x| x.0 >= t).collect()).unwrap_or_default();
        let wrong = above.iter().filter(|x| !x.1).count();
        SemanticStats {
            tenant: name,
            draft_tokens: d.0,
            draft_accepted: d.1,
            checks: o.len() as u64,
            checks_correct: o.iter().filter(|x| x.1).count() as u64,
            trust_threshold: threshold,
            trust_outcomes: above.len() as u64,
            trust_wrong: wrong as u64,
            trust_false_hit_bound: threshold.map(|_| wilson_upper(wrong, above.len(), p.z)),
        }
    };
    let mut names: Vec<String> = drafts.keys().chain(outcomes.keys()).cloned().collect();
    names.sort();
    names.dedup();
    let mut out: Vec<SemanticStats> =
        names.iter().map(|t| build(t.clone(), drafts.get(t).copied().unwrap_or_default(), outcomes.get(t).map_or(&[][..], |v| v))).collect();
    if tenant.is_none() && out.len() > 1 {
        let d = drafts.values().fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        // TRUST learns per tenant; the total shows the pooled evidence.
        let all: Vec<(f64, bool)> = outcomes.values().flatten().copied().collect();
        out.push(build("*".into(), d, &all));
    }
    out
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
