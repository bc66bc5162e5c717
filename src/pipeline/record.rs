//! Recording, the pipeline's last stage and the one place an outcome is written: the request's
//! row in `inferences` (before its last piece is sent, so the outcome carries the row id), the
//! KV blocks it computed, then — for a computed answer that may use caches — its facts, the
//! exact cache's entry for its key, the semantic index and TRUST's evidence; the metrics and the
//! request's one log line. Failures after the row is written are logged: the answer stands.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::ServiceError;
use super::request::Outcome;
use super::validation::Plan;
use super::Pipeline;
use crate::cache::equivalent::{self, Score};
use crate::engine::scheduler::replay_drafts;
use crate::store::semantic::{EquivalenceObservation, Outcome as SemanticOutcome};
use crate::store::{CachedAnswer, NewInference};
use crate::vocab::{CacheMode, ServedFrom, StopReason};
use crate::workload::{BlendData, ReportData};

/// Where an answer came from and what it cost.
pub(crate) struct Answer {
    /// The tier that served it (or the model).
    pub(crate) from: ServedFrom,
    /// The answer's text.
    pub(crate) text: String,
    /// The answer's token ids.
    pub(crate) tokens: Vec<u32>,
    /// Why the answer ended.
    pub(crate) stop: StopReason,
    /// The stored inference it was served from (exact and semantic tiers, drafts).
    pub(crate) source_inference_id: Option<i64>,
    /// The fact it was served from (fact tier).
    pub(crate) source_fact_id: Option<i64>,
    /// Positions the model computed for it.
    pub(crate) tokens_computed: usize,
    /// Tokens whose computation was reused instead of redone.
    pub(crate) tokens_reused: usize,
    /// Submit to admission (zero for a cache tier).
    pub(crate) queue: Duration,
    /// Admission to the first token; EQUIVALENT: the check's time; other cache tiers: zero.
    pub(crate) prefill: Duration,
    /// First token to the end (zero for a cache tier).
    pub(crate) decode: Duration,
    /// The most sequences that shared one forward call with it (0: no engine work).
    pub(crate) peak_batch: usize,
    /// Received to first token (`None`: no token).
    pub(crate) ttft: Option<Duration>,
    /// Prompt tokens whose KV came from stored blocks.
    pub(crate) kv_tokens_reused: usize,
    /// Draft tokens offered / accepted, and the neighbours tried.
    pub(crate) draft_tokens: usize,
    /// Draft tokens the model agreed with.
    pub(crate) draft_accepted: usize,
    /// Candidates whose tokens were fed.
    pub(crate) candidates_tried: usize,
    /// Similarity of the neighbour the answer came from (semantic tiers).
    pub(crate) similarity: Option<f64>,
    /// log p of each answer token (and the stop) under this prompt, when the model computed them.
    pub(crate) logprobs: Option<Vec<f32>>,
    /// EQUIVALENT: the served candidate's score.
    pub(crate) equivalence: Option<Score>,
    /// What KV reuse did (the plan the engine gave back; a cancelled request: what was
    /// planned, no new blocks). `None`: no KV reuse for this request.
    pub(crate) kv: Option<ReportData>,
    /// What BLEND did (the plan the engine gave back). `None`: not a BLEND request.
    pub(crate) blend: Option<BlendData>,
}

impl Answer {
    /// An answer that no engine work produced (a cache tier), or a cancelled one to complete.
    pub(crate) fn stored(from: ServedFrom, text: String, tokens: Vec<u32>, stop: StopReason, tokens_reused: usize) -> Answer {
        Answer {
            from,
            text,
            tokens,
            stop,
            source_inference_id: None,
            source_fact_id: None,
            tokens_computed: 0,
            tokens_reused,
            queue: Duration::ZERO,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            peak_batch: 0,
            ttft: None,
            kv_tokens_reused: 0,
            draft_tokens: 0,
            draft_accepted: 0,
            candidates_tried: 0,
            similarity: None,
            logprobs: None,
            equivalence: None,
            kv: None,
            blend: None,
        }
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Pipeline {
    /// Records the request, learns from a computed answer, updates the exact cache; returns the
    /// outcome. Blocking: answers from the caches call it on the blocking thread that found them
    /// (one thread hop less on the hit path), the engine's answers through [`Pipeline::record`].
    pub(crate) fn record_now(&self, plan: &Plan, answer: Answer) -> Result<Outcome, ServiceError> {
        let started = Instant::now();
        let _span = tracing::debug_span!("record").entered();
        let latency = plan.received.elapsed();
        let (p, a) = (plan, &answer);
        let similarity = a.similarity.unwrap_or(if a.from == ServedFrom::Model { 0.0 } else { 1.0 });
        let equivalence = a.equivalence.or(p.equivalence.as_ref().map(|c| c.score));
        let computed = a.from.computed() && a.stop != StopReason::Cancelled;
        // What an EXACT hit on this row will need without the tokenizer.
        let replayable = computed && p.cache_key.is_some();
        let id = self.store.record_inference(&NewInference {
            tenant: &p.tenant,
            question: p.question.as_deref(),
            prompt: &p.prompt,
            prompt_hash: &p.prompt_hash,
            model: &self.model_name,
            model_id: &self.model_id,
            params: &p.params_json,
            cache_mode: p.mode,
            cache_key: p.cache_key.as_deref(),
            served_from: a.from,
            source_inference_id: a.source_inference_id,
            source_fact_id: a.source_fact_id,
            similarity: a.similarity.or((a.from != ServedFrom::Model).then_some(1.0)),
            prompt_tokens: p.prompt_ids.len(),
            completion_tokens: a.tokens.len(),
            tokens_computed: a.tokens_computed,
            tokens_reused: a.tokens_reused,
            stop_reason: a.stop,
            response: &a.text,
            response_tokens: &a.tokens,
            prompt_token_ids: replayable.then_some(&p.prompt_ids[..]),
            queue_ms: ms(a.queue),
            prefill_ms: ms(a.prefill),
            decode_ms: ms(a.decode),
            latency_ms: ms(latency),
            backend: &self.backend,
            ttft_ms: a.ttft.map(ms),
            kv_tokens_reused: a.kv_tokens_reused,
            draft_tokens: a.draft_tokens,
            draft_accepted: a.draft_accepted,
            candidates_tried: a.candidates_tried,
            response_logprobs: a.logprobs.as_deref().filter(|l| !l.is_empty() && a.stop != StopReason::Cancelled),
            equivalence_mean: equivalence.map(|e| e.mean_margin),
            equivalence_worst: equivalence.map(|e| e.worst_margin),
            equivalence_checks: p.equivalence_checks,
        })?;
        // An EQUIVALENT check published the prompt's blocks before this request's own job ran.
        let merged;
        let report = match (&a.kv, &p.check_kv) {
            (Some(r), Some(c)) if !c.new_blocks.is_empty() => {
                merged = ReportData { new_blocks: c.new_blocks.iter().chain(&r.new_blocks).cloned().collect(), ..r.clone() };
                Some(&merged)
            }
            (r, _) => r.as_ref(),
        };
        if let (Some(kv), Some(report)) = (&self.kv, report) {
            let decode = |t: &[u32]| self.tokenizer().ok()?.decode(t, false).ok();
            match kv.finish(&p.tenant, report, id, &p.prompt_ids, decode) {
                Ok(_) => self.metrics.kv_blocks(&p.tenant, report),
                Err(e) => tracing::warn!(inference_id = id, error = %e, "storing the KV blocks failed"),
            }
        }
        if let (Some(kv), Some(blend)) = (&self.kv, &a.blend) {
            if let Err(e) = kv.finish_blend(&p.tenant, blend, id, p.prompt_ids.len()) {
                tracing::warn!(inference_id = id, error = %e, "recording what BLEND reused failed");
            }
            if let Some(why) = &blend.engine.fallback {
                tracing::info!(inference_id = id, reason = %why, "BLEND ran as a full prefill");
            }
        }
        // BYPASS learns nothing; BLEND's answers are lossy: no facts, no semantic index.
        if computed && !matches!(p.mode, CacheMode::Bypass | CacheMode::Blend) {
            if let Err(e) = self.store.learn(&p.tenant, id, p.question.as_deref(), &p.prompt_hash, &a.text) {
                tracing::warn!(inference_id = id, error = %e, "fact extraction failed");
            }
            self.learn_semantic(p, a, id);
            if let Some(ix) = &self.fact_indexer {
                // Fact embeddings are for later lookups: off the answer's path, while no
                // request runs (`cache::indexer`).
                ix.notify(&p.tenant);
            }
        }
        if let (true, Some(key)) = (computed, &p.cache_key) {
            let cached = CachedAnswer {
                inference_id: id,
                response: a.text.clone(),
                response_tokens: a.tokens.clone(),
                stop_reason: a.stop,
                tokens_computed: a.tokens_computed,
                prompt_token_ids: Some(p.prompt_ids.clone()),
            };
            self.exact.put(key, cached);
        }
        let outcome = Outcome {
            served_from: a.from,
            stop_reason: a.stop,
            cache_mode: p.mode,
            inference_id: id,
            source_inference_id: a.source_inference_id,
            source_fact_id: a.source_fact_id,
            similarity,
            prompt_token_ids: p.prompt_ids.clone(),
            completion_tokens: a.tokens.len(),
            tokens_computed: a.tokens_computed,
            tokens_reused: a.tokens_reused,
            kv_tokens_reused: a.kv_tokens_reused,
            blend_tokens_reused: a.blend.as_ref().map_or(0, |b| b.engine.reused),
            blend_tokens_recomputed: a.blend.as_ref().map_or(0, |b| b.engine.recomputed),
            queue_ms: ms(a.queue),
            prefill_ms: ms(a.prefill),
            decode_ms: ms(a.decode),
            latency_ms: ms(latency),
            ttft_ms: a.ttft.map(ms),
            peak_batch: a.peak_batch,
            model: self.model_name.clone(),
            backend: self.backend.clone(),
            draft_tokens: a.draft_tokens,
            draft_tokens_accepted: a.draft_accepted,
            candidates_tried: a.candidates_tried,
            equivalence,
            equivalence_checks: p.equivalence_checks,
        };
        self.metrics.request(&p.tenant, &outcome, (a.queue, a.prefill, a.decode));
        self.metrics.stage("record", started.elapsed());
        tracing::info!(
            request_id = p.request_id,
            tenant = %p.tenant,
            inference_id = id,
            served_from = %a.from,
            cache_mode = %p.mode,
            stop = %a.stop,
            prompt_tokens = p.prompt_ids.len(),
            // false: answered from the store without the tokenizer (an EXACT hit).
            tokenized = p.tokenized,
            // true: the semantic tier was skipped (draft gate, `cache::skip`).
            lookup_skipped = p.lookup_skipped,
            completion_tokens = a.tokens.len(),
            tokens_computed = a.tokens_computed,
            tokens_reused = a.tokens_reused,
            ttft_ms = a.ttft.map(ms).unwrap_or_default(),
            latency_ms = ms(latency),
            "request"
        );
        Ok(outcome)
    }

    /// [`Pipeline::record_now`] on the blocking pool.
    pub(crate) async fn record(self: &Arc<Self>, plan: Arc<Plan>, answer: Answer) -> Result<Outcome, ServiceError> {
        let state = self.clone();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || span.in_scope(|| state.record_now(&plan, answer))).await?
    }

    /// After a computed answer: files the question's embedding for later neighbours, tells TRUST
    /// what verifying the nearest neighbour found (nothing for a request that skipped the
    /// semantic tier: `Plan::lookup_skipped`). Failures are logged: the answer itself is
    /// already recorded.
    fn learn_semantic(&self, plan: &Plan, answer: &Answer, id: i64) {
        let (Some(sem), Some(scope), Some(question)) = (&self.semantic, &plan.scope, &plan.question) else { return };
        if plan.lookup_skipped {
            return;
        }
        let result = (|| -> Result<(), String> {
            let embedding = match &plan.embedding {
                Some(e) => e.clone(),
                None => sem.embed(question).map_err(|e| e.to_string())?,
            };
            self.store.index_prompt(&plan.tenant, scope, id, &embedding).map_err(|e| e.to_string())?;
            if let Some(top) = &plan.top {
                let correct = answer.from == ServedFrom::Verified && answer.source_inference_id == Some(top.inference_id);
                let o = SemanticOutcome { source_inference_id: top.inference_id, similarity: top.similarity, correct };
                self.store.record_outcome(&plan.tenant, &self.model_id, id, &o, answer.draft_tokens, answer.draft_accepted).map_err(|e| e.to_string())?;
                sem.trust.observe(&self.store, &plan.tenant, &self.model_id, &o).map_err(|e| e.to_string())?;
                sem.drafts.observe(&self.store, &plan.tenant, &self.model_id, top.similarity, answer.draft_tokens, answer.draft_accepted).map_err(|e| e.to_string())?;
            } else if let (Some((top, drafts)), StopReason::Stop | StopReason::Length) = (&plan.skipped, answer.stop) {
                // Drafts skipped for a greedy request: what verifying them would have found,
                // replayed on the answer (the model's choices), learned from as if checked.
                let mut chosen = answer.tokens.clone();
                if answer.stop == StopReason::Stop {
                    chosen.extend(plan.params.stop_ids.first());
                }
                let (fed, accepted) = replay_drafts(drafts, &chosen, plan.params.max_tokens, &plan.params.stop_ids);
                let correct = !chosen.is_empty() && accepted == chosen.len();
                let o = SemanticOutcome { source_inference_id: top.inference_id, similarity: top.similarity, correct };
                self.store.record_outcome(&plan.tenant, &self.model_id, id, &o, fed, accepted).map_err(|e| e.to_string())?;
                sem.trust.observe(&self.store, &plan.tenant, &self.model_id, &o).map_err(|e| e.to_string())?;
                sem.drafts.observe(&self.store, &plan.tenant, &self.model_id, top.similarity, fed, accepted).map_err(|e| e.to_string())?;
            }
            self.learn_equivalence(plan, answer, id).map_err(|e| e.to_string())?;
            Ok(())
        })();
        if let Err(e) = result {
            tracing::warn!(inference_id = id, error = %e, "semantic indexing failed");
        }
    }

    /// After a computed answer F to a request whose EQUIVALENT candidate A was scored but not
    /// served: whether A was acceptable (A is F, or A's log-likelihood per token under this
    /// prompt is within the margin of F's), recorded and learned from.
    fn learn_equivalence(&self, plan: &Plan, answer: &Answer, id: i64) -> Result<(), crate::store::StoreError> {
        let (Some(sem), Some(check), Some(fresh)) = (&self.semantic, &plan.equivalence, &answer.logprobs) else { return Ok(()) };
        // Judged on the prefix the candidate was scored on.
        let Some(fresh_ll) = equivalent::mean_ll(&fresh[..equivalent::scored_len(fresh.len(), sem.equivalent.params.prefix)]) else { return Ok(()) };
        let mut own = answer.tokens.clone();
        if answer.stop == StopReason::Stop && fresh.len() > answer.tokens.len() {
            own.extend(plan.params.stop_ids.first());
        }
        let same = own == check.tokens;
        let o = EquivalenceObservation {
            source_inference_id: check.source,
            similarity: check.similarity,
            mean_margin: check.score.mean_margin,
            worst_margin: check.score.worst_margin,
            candidate_ll: check.score.candidate_ll,
            fresh_ll,
            acceptable: equivalent::acceptable(same, check.score.candidate_ll, fresh_ll, sem.equivalent.params.margin),
        };
        self.store.record_equivalence(&plan.tenant, &self.model_id, id, &o)?;
        sem.equivalent.observe(&self.store, &plan.tenant, &self.model_id, &o)
    }
}
