//! `inferences`: one row per request. The rows of computed, cacheable answers are also the
//! persistent layer of the exact cache: a lookup is the newest MODEL row with the key that no
//! REFRESH has superseded.

use rusqlite::{named_params, OptionalExtension};

use super::{now_sql, parse_stop_reason, SqliteStore, StoreError};
use crate::vocab::{CacheMode, ServedFrom, StopReason};

/// Everything recorded about one request.
#[derive(Debug, Clone)]
pub struct NewInference<'a> {
    /// The tenant that sent the request.
    pub tenant: &'a str,
    /// The user's question for single-question requests (what facts are filed under).
    pub question: Option<&'a str>,
    /// The rendered prompt the model saw.
    pub prompt: &'a str,
    /// sha256 (hex) of `prompt`.
    pub prompt_hash: &'a str,
    /// The served model's name.
    pub model: &'a str,
    /// sha256 (hex) of the model file.
    pub model_id: &'a str,
    /// JSON object of the request's generation parameters.
    pub params: &'a str,
    /// The request's cache mode.
    pub cache_mode: CacheMode,
    /// Exact-cache key; `None` when the answer must not be cached.
    pub cache_key: Option<&'a str>,
    /// The tier that answered.
    pub served_from: ServedFrom,
    /// The inference whose answer was reused, if any.
    pub source_inference_id: Option<i64>,
    /// FACT: the fact that answered.
    pub source_fact_id: Option<i64>,
    /// The neighbour's similarity when one was used, else 1 for cache hits, `None` when computed.
    pub similarity: Option<f64>,
    /// Prompt length, tokens.
    pub prompt_tokens: usize,
    /// Answer length, tokens.
    pub completion_tokens: usize,
    /// Positions the model computed (prompt + decode steps); 0 when served without the model.
    pub tokens_computed: usize,
    /// Tokens whose computation was reused instead of redone.
    pub tokens_reused: usize,
    /// Why the answer stopped.
    pub stop_reason: StopReason,
    /// The answer text.
    pub response: &'a str,
    /// The answer's token ids.
    pub response_tokens: &'a [u32],
    /// The prompt's token ids, kept on a computed answer the exact cache may replay (`None`
    /// elsewhere): an EXACT hit then needs no tokenizer.
    pub prompt_token_ids: Option<&'a [u32]>,
    /// Time waiting in the engine's queue, ms.
    pub queue_ms: f64,
    /// Prompt processing time, ms.
    pub prefill_ms: f64,
    /// Decoding time, ms.
    pub decode_ms: f64,
    /// Request received to recording, ms.
    pub latency_ms: f64,
    /// The compute backend that ran the model.
    pub backend: &'a str,
    /// Received to first token; `None` when no token was produced.
    pub ttft_ms: Option<f64>,
    /// Prompt tokens whose KV came from stored blocks.
    pub kv_tokens_reused: usize,
    /// Draft tokens offered to the model.
    pub draft_tokens: usize,
    /// Draft tokens the model agreed with.
    pub draft_accepted: usize,
    /// Neighbours whose answers were tried as drafts.
    pub candidates_tried: usize,
    /// log p of each answer token (and the stop) under this prompt, when the model computed them.
    pub response_logprobs: Option<&'a [f32]>,
    /// EQUIVALENT: the served (or best) candidate's mean and worst margins, and the candidates scored.
    pub equivalence_mean: Option<f64>,
    /// The worst margin of that candidate.
    pub equivalence_worst: Option<f64>,
    /// EQUIVALENT candidates scored.
    pub equivalence_checks: usize,
}

/// A computed answer the exact cache can replay.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedAnswer {
    /// The answer's row in `inferences`.
    pub inference_id: i64,
    /// The answer text.
    pub response: String,
    /// The answer's token ids.
    pub response_tokens: Vec<u32>,
    /// Why the answer stopped.
    pub stop_reason: StopReason,
    /// Positions the model computed for it (what a replay saves).
    pub tokens_computed: usize,
    /// The prompt's token ids as recorded with the answer (`None`: a row written before
    /// migration 0009; the prompt must be tokenized).
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A JSON array of token ids read back from column `column` of inference `id`.
pub(crate) fn token_ids(id: i64, column: &str, json: &str) -> Result<Vec<u32>, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Malformed(format!("inference {id} {column}: {e}")))
}

impl SqliteStore {
    /// Records a request and what it implies, in one transaction: a REFRESH answer supersedes
    /// the earlier answers under its cache key; an EXACT replay counts as a reuse of the source
    /// answer's reasoning chain; a FACT answer counts as a reuse of the fact. Returns the row id.
    pub fn record_inference(&self, r: &NewInference<'_>) -> Result<i64, StoreError> {
        let tokens = serde_json::to_string(r.response_tokens).map_err(|e| StoreError::Malformed(e.to_string()))?;
        let prompt_ids = r.prompt_token_ids.map(serde_json::to_string).transpose().map_err(|e| StoreError::Malformed(e.to_string()))?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO inferences (tenant, question, prompt, prompt_hash, model, model_id, params, cache_mode,
                 cache_key, served_from, source_inference_id, source_fact_id, similarity, prompt_tokens,
                 completion_tokens, tokens_computed, tokens_reused, stop_reason, response, response_tokens,
                 queue_ms, prefill_ms, decode_ms, latency_ms, backend, ttft_ms, kv_tokens_reused, draft_tokens,
                 draft_accepted, candidates_tried, response_logprobs, equivalence_mean, equivalence_worst, equivalence_checks,
                 prompt_token_ids)
             VALUES (:tenant, :question, :prompt, :prompt_hash, :model, :model_id, :params, :cache_mode,
                 :cache_key, :served_from, :source_inference_id, :source_fact_id, :similarity, :prompt_tokens,
                 :completion_tokens, :tokens_computed, :tokens_reused, :stop_reason, :response, :response_tokens,
                 :queue_ms, :prefill_ms, :decode_ms, :latency_ms, :backend, :ttft_ms, :kv_tokens_reused, :draft_tokens,
                 :draft_accepted, :candidates_tried, :response_logprobs, :equivalence_mean, :equivalence_worst,
                 :equivalence_checks, :prompt_token_ids)",
            named_params! {
                ":tenant": r.tenant, ":question": r.question, ":prompt": r.prompt, ":prompt_hash": r.prompt_hash,
                ":model": r.model, ":model_id": r.model_id, ":params": r.params, ":cache_mode": r.cache_mode.as_str(),
                ":cache_key": r.cache_key, ":served_from": r.served_from.as_str(),
                ":source_inference_id": r.source_inference_id, ":source_fact_id": r.source_fact_id,
                ":similarity": r.similarity, ":prompt_tokens": r.prompt_tokens as i64,
                ":completion_tokens": r.completion_tokens as i64, ":tokens_computed": r.tokens_computed as i64,
                ":tokens_reused": r.tokens_reused as i64, ":stop_reason": r.stop_reason.as_str(),
                ":response": r.response, ":response_tokens": tokens, ":prompt_token_ids": prompt_ids, ":queue_ms": r.queue_ms,
                ":prefill_ms": r.prefill_ms, ":decode_ms": r.decode_ms, ":latency_ms": r.latency_ms,
                ":backend": r.backend, ":ttft_ms": r.ttft_ms, ":kv_tokens_reused": r.kv_tokens_reused as i64,
                ":draft_tokens": r.draft_tokens as i64, ":draft_accepted": r.draft_accepted as i64,
                ":candidates_tried": r.candidates_tried as i64,
                ":response_logprobs": r.response_logprobs.map(super::blob),
                ":equivalence_mean": r.equivalence_mean, ":equivalence_worst": r.equivalence_worst,
                ":equivalence_checks": r.equivalence_checks as i64,
            },
        )?;
        let id = tx.last_insert_rowid();
        match (r.served_from, r.cache_mode, r.cache_key) {
            (ServedFrom::Model, CacheMode::Refresh, Some(key)) => {
                tx.execute(
                    "UPDATE inferences SET superseded_by = ?1
                     WHERE tenant = ?2 AND cache_key = ?3 AND served_from IN ('MODEL', 'VERIFIED', 'PARTIAL') AND superseded_by IS NULL AND id != ?1",
                    rusqlite::params![id, r.tenant, key],
                )?;
            }
            (ServedFrom::Exact, _, _) => {
                tx.execute(
                    concat!(
                        "UPDATE reasoning_chains SET reuse_count = reuse_count + 1, last_reused_at = ",
                        now_sql!(),
                        " WHERE tenant = ?1 AND inference_id = ?2"
                    ),
                    rusqlite::params![r.tenant, r.source_inference_id],
                )?;
            }
            (ServedFrom::Fact, _, _) => {
                tx.execute(
                    concat!(
                        "UPDATE facts SET reuse_count = reuse_count + 1, last_reused_at = ",
                        now_sql!(),
                        " WHERE tenant = ?1 AND id = ?2"
                    ),
                    rusqlite::params![r.tenant, r.source_fact_id],
                )?;
            }
            _ => {}
        }
        tx.commit()?;
        Ok(id)
    }

    /// The answer the exact cache holds for `key` in `tenant`: the newest computed, complete
    /// (not cancelled), not superseded answer recorded under it.
    pub fn find_exact(&self, tenant: &str, key: &str) -> Result<Option<CachedAnswer>, StoreError> {
        let row = self
            .conn()
            .query_row(
                "SELECT id, response, response_tokens, stop_reason, tokens_computed, prompt_token_ids FROM inferences
                 WHERE tenant = ?1 AND cache_key = ?2 AND served_from IN ('MODEL', 'VERIFIED', 'PARTIAL') AND superseded_by IS NULL
                   AND stop_reason != 'cancelled'
                 ORDER BY id DESC LIMIT 1",
                rusqlite::params![tenant, key],
                |r| {
                    let columns = (r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?);
                    Ok((columns, r.get::<_, i64>(4)?, r.get::<_, Option<String>>(5)?))
                },
            )
            .optional()?;
        let Some(((inference_id, response, tokens, stop), computed, prompt_ids)) = row else {
            return Ok(None);
        };
        Ok(Some(CachedAnswer {
            inference_id,
            response,
            response_tokens: token_ids(inference_id, "response_tokens", &tokens)?,
            stop_reason: parse_stop_reason(&stop)?,
            tokens_computed: computed.max(0) as usize,
            prompt_token_ids: prompt_ids.map(|ids| token_ids(inference_id, "prompt_token_ids", &ids)).transpose()?,
        }))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample<'a>(tenant: &'a str, key: Option<&'a str>, served_from: ServedFrom, mode: CacheMode) -> NewInference<'a> {
        NewInference {
            tenant,
            question: Some("What is the capital of France?"),
            prompt: "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
            prompt_hash: "ph",
            model: "m",
            model_id: "mid",
            params: "{}",
            cache_mode: mode,
            cache_key: key,
            served_from,
            source_inference_id: None,
            source_fact_id: None,
            similarity: None,
            prompt_tokens: 10,
            completion_tokens: 3,
            tokens_computed: 12,
            tokens_reused: 0,
            stop_reason: StopReason::Stop,
            response: "Paris.",
            response_tokens: &[1, 2, 3],
            prompt_token_ids: Some(&[7, 8, 9]),
            queue_ms: 0.0,
            prefill_ms: 1.0,
            decode_ms: 2.0,
            latency_ms: 3.5,
            backend: "test",
            ttft_ms: Some(1.5),
            kv_tokens_reused: 0,
            draft_tokens: 0,
            draft_accepted: 0,
            candidates_tried: 0,
            response_logprobs: Some(&[-0.5, -0.25, -0.125, -1.0]),
            equivalence_mean: None,
            equivalence_worst: None,
            equivalence_checks: 0,
        }
    }

    #[test]
    fn exact_lookup_is_per_tenant_and_refresh_supersedes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path().join("s.db")).expect("open");
        assert_eq!(store.find_exact("a", "k").expect("lookup"), None);
        let first = store.record_inference(&sample("a", Some("k"), ServedFrom::Model, CacheMode::Auto)).expect("record");
        let hit = store.find_exact("a", "k").expect("lookup").expect("hit");
        assert_eq!((hit.inference_id, hit.response.as_str(), hit.response_tokens.as_slice()), (first, "Paris.", &[1u32, 2, 3][..]));
        assert_eq!(hit.prompt_token_ids.as_deref(), Some(&[7u32, 8, 9][..]), "the prompt's ids come back with the answer");
        assert_eq!(store.find_exact("b", "k").expect("lookup"), None, "another tenant must not see it");

        let second = store.record_inference(&sample("a", Some("k"), ServedFrom::Model, CacheMode::Refresh)).expect("record");
        assert_eq!(store.find_exact("a", "k").expect("lookup").expect("hit").inference_id, second);
        let by: Option<i64> =
            store.conn().query_row("SELECT superseded_by FROM inferences WHERE id = ?1", [first], |r| r.get(0)).expect("row");
        assert_eq!(by, Some(second));
    }

    #[test]
    fn cancelled_answers_are_not_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path().join("s.db")).expect("open");
        let mut r = sample("a", Some("k"), ServedFrom::Model, CacheMode::Auto);
        r.stop_reason = StopReason::Cancelled;
        store.record_inference(&r).expect("record");
        assert_eq!(store.find_exact("a", "k").expect("lookup"), None);
    }
}
