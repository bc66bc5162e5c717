//! The cache tiers, in order, as calls into `cache/` and the store: FACT (a live user-provided
//! fact filed under the question), EXACT (the recorded answer to the same key), then the
//! semantic tier — TRUST serves a neighbour's answer when its learned bound allows, else the
//! neighbours' answers become drafts the engine verifies (VERIFIED / PARTIAL); EQUIVALENT has the
//! model score the neighbours' answers under the new prompt and serves one its learned region
//! accepts. Which tiers a request may use follows its cache mode.
//!
//! FACT and EXACT look up by the question and by the key, both from the prompt's text, before
//! the prompt is tokenized ([`Pipeline::lookup_stored`]); the semantic tier needs the tokens
//! ([`Pipeline::lookup_similar`], after [`Pipeline::tokenize`]).

use std::time::Instant;

use super::error::ServiceError;
use super::record::Answer;
use super::validation::Plan;
use super::kv::Kv;
use super::Pipeline;
use super::validation::EquivalenceCheck;
use crate::cache::equivalent::{self, Score};
use crate::cache::semantic::{draft_of, fits_budget, SemanticCache};
use crate::cache::skip::Gate;
use crate::engine::scheduler::{Draft, Event, Job};
use crate::store::semantic::Neighbour;
use crate::vocab::{CacheMode, ServedFrom, StopReason};
use crate::workload::{KvPlan, ReportData};

/// What the caches found for a request.
pub(crate) enum Found {
    Answer(Answer),
    /// Candidate answers for the engine to verify.
    Drafts(Vec<Draft>),
    Nothing,
}

/// Whether a request in this mode may be served by a cache tier.
fn looks_up(mode: CacheMode) -> bool {
    matches!(mode, CacheMode::Auto | CacheMode::Verified | CacheMode::Trust | CacheMode::Exact | CacheMode::Equivalent)
}

impl Pipeline {
    /// FACT, then EXACT: the answers filed under the question and under the exact key. An
    /// EXACT hit whose row kept its prompt's token ids is answered without tokenizing; a FACT
    /// answer (and a hit on an older row) tokenizes. Blocking (store).
    pub(crate) fn lookup_stored(&self, plan: &mut Plan) -> Result<Option<Answer>, ServiceError> {
        if !looks_up(plan.mode) {
            return Ok(None);
        }
        if let Some(q) = &plan.question {
            if let Some(fact) = self.store.fact_answer(&plan.tenant, q)? {
                self.tokenize(plan)?;
                let tokens = self.tokenizer()?.encode(&fact.content, false).map_err(|e| ServiceError::Internal(e.to_string()))?;
                let saved = plan.prompt_ids.len() + tokens.len();
                let mut a = Answer::stored(ServedFrom::Fact, fact.content, tokens, StopReason::Stop, saved);
                a.source_fact_id = Some(fact.id);
                return Ok(Some(a));
            }
        }
        if let Some(key) = &plan.cache_key {
            if let Some(hit) = self.exact.get(&plan.tenant, key)? {
                match &hit.prompt_token_ids {
                    Some(ids) => self.set_prompt_ids(plan, ids.clone())?,
                    None => self.tokenize(plan)?,
                }
                let mut a = Answer::stored(ServedFrom::Exact, hit.response.clone(), hit.response_tokens.clone(), hit.stop_reason, hit.tokens_computed);
                a.source_inference_id = Some(hit.inference_id);
                return Ok(Some(a));
            }
        }
        Ok(None)
    }

    /// The semantic tier, for a tokenized request the stored answers did not serve: TRUST, then
    /// EQUIVALENT, else drafts. Blocking (store, embedding).
    pub(crate) fn lookup_similar(&self, plan: &mut Plan) -> Result<Found, ServiceError> {
        if !looks_up(plan.mode) {
            return Ok(Found::Nothing);
        }
        let (Some(sem), Some(scope), Some(question)) = (&self.semantic, &plan.scope, &plan.question) else {
            return Ok(Found::Nothing);
        };
        if plan.mode == CacheMode::Exact {
            return Ok(Found::Nothing);
        }
        let t = Instant::now();
        let embedding = tracing::debug_span!("embed").in_scope(|| sem.embed(question)).map_err(|e| ServiceError::Internal(e.to_string()))?;
        self.metrics.stage("embed", t.elapsed());
        let neighbours = sem.neighbours(scope, &embedding).map_err(|e| ServiceError::Internal(e.to_string()))?;
        plan.embedding = Some(embedding);
        let Some(top) = neighbours.first() else { return Ok(Found::Nothing) };
        let greedy = plan.params.sampling.is_greedy();
        let comparable = greedy && fits_budget(top, plan.params.max_tokens);
        if plan.mode == CacheMode::Trust && comparable && sem.trust.trusts(&self.store, &plan.tenant, &self.model_id, top)? {
            let saved = plan.prompt_ids.len() + top.response_tokens.len();
            let mut a = Answer::stored(ServedFrom::Trust, top.response.clone(), top.response_tokens.clone(), top.stop_reason, saved);
            a.source_inference_id = Some(top.inference_id);
            a.similarity = Some(top.similarity);
            return Ok(Found::Answer(a));
        }
        let stop = plan.params.stop_ids.first().copied();
        if plan.mode == CacheMode::Equivalent && greedy {
            if let Some(a) = self.equivalent(plan, sem, &neighbours, stop)? {
                return Ok(Found::Answer(a));
            }
        }
        let drafts: Vec<Draft> = neighbours.iter().take(sem.config.max_drafts).map(|n| draft_of(n, stop)).collect();
        // VERIFIED's drafts cost rows the model throws away where they do not pay: skipped in
        // similarity bands whose acceptance is below the floor (TRUST needs the checks). A
        // skipped comparable greedy request is replayed on its answer (`cache::skip`).
        if plan.mode != CacheMode::Trust
            && sem.drafts.offer(&self.store, &plan.tenant, &self.model_id, top.similarity, comparable, self.scheduler.draft_row_share())? == Gate::Skip
        {
            if comparable {
                plan.skipped = Some((top.clone(), drafts));
            }
            return Ok(Found::Nothing);
        }
        if comparable {
            plan.top = Some(top.clone());
        }
        Ok(Found::Drafts(drafts))
    }

    /// EQUIVALENT: the model scores the nearest answers under this prompt in one batch of
    /// teacher-forced passes; the best (by mean margin against its own prompt) is served when
    /// the learned region holds it and it is not picked for exploration. Else `None` (the
    /// request goes on as VERIFIED, and its fresh answer tells whether the candidate was
    /// acceptable). Blocking.
    fn equivalent(&self, plan: &mut Plan, sem: &SemanticCache, neighbours: &[Neighbour], stop: Option<u32>) -> Result<Option<Answer>, ServiceError> {
        let max_tokens = plan.params.max_tokens;
        let candidates: Vec<(&Neighbour, Draft)> = neighbours
            .iter()
            .filter(|n| fits_budget(n, max_tokens))
            .map(|n| (n, draft_of(n, stop)))
            .filter(|(n, d)| n.logprobs.as_ref().is_some_and(|l| l.len() == d.tokens.len()))
            .take(sem.config.equivalent.candidates.max(1))
            .collect();
        if candidates.is_empty() {
            return Ok(None);
        }
        let t = Instant::now();
        let prefix = sem.equivalent.params.prefix;
        // The first candidate's job loads the prompt's stored prefix (the chat template's
        // blocks) and publishes the rest of the prompt's KV; the others start after it, so the
        // new prompt is computed once for all of them (each recomputes only its last token).
        let mut best: Option<(usize, Score)> = None;
        let (mut computed, mut kv_reused) = (0, 0);
        let mut report: Option<ReportData> = None;
        let rest = (candidates.len() > 1).then_some(1..candidates.len());
        for batch in std::iter::once(0..1).chain(rest) {
            let mut waiting = Vec::new();
            for i in batch {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let tokens = &candidates[i].1.tokens;
                let scored = &tokens[..equivalent::scored_len(tokens.len(), prefix)];
                let mut job = Job::score(plan.prompt_ids.clone(), scored.to_vec(), plan.params.stop_ids.clone(), plan.tenant.clone(), tx);
                job.kv = match self.prepare_kv(plan) {
                    Some(Kv::Prefix(p)) => Some(Box::new(p)),
                    _ => None,
                };
                self.scheduler.submit(job)?;
                waiting.push((i, rx));
            }
            for (i, mut rx) in waiting {
                let mut scored = match rx.blocking_recv() {
                    Some(Event::Scored(s)) => s,
                    Some(Event::Failed(e)) => return Err(ServiceError::Job(e)),
                    _ => return Err(ServiceError::Internal("the engine stopped while scoring".into())),
                };
                computed += scored.computed;
                if i == 0 {
                    // What the first job reused and published stands for the check.
                    kv_reused = scored.kv_reused;
                    report = scored.prefix.take().and_then(|p| p.into_any().downcast::<KvPlan>().ok()).map(|p| p.into_report());
                }
                let own = candidates[i].0.logprobs.as_deref().unwrap_or_default();
                let own = &own[..equivalent::scored_len(own.len(), prefix)];
                if let Some(s) = equivalent::score(&scored.logprobs, own) {
                    if best.is_none_or(|(_, b)| s.mean_margin > b.mean_margin) {
                        best = Some((i, s));
                    }
                }
            }
        }
        self.metrics.stage("equivalence", t.elapsed());
        plan.equivalence_checks = candidates.len();
        let Some((i, score)) = best else { return Ok(None) };
        let (n, d) = &candidates[i];
        if sem.equivalent.serves(&self.store, &plan.tenant, &self.model_id, &score)? {
            let saved = n.response_tokens.len();
            let mut a = Answer::stored(ServedFrom::Equivalent, n.response.clone(), n.response_tokens.clone(), n.stop_reason, saved);
            a.source_inference_id = Some(n.inference_id);
            a.similarity = Some(n.similarity);
            a.tokens_computed = computed;
            a.equivalence = Some(score);
            a.prefill = t.elapsed();
            a.kv_tokens_reused = kv_reused;
            a.kv = report;
            return Ok(Some(a));
        }
        plan.check_kv = report;
        plan.equivalence = Some(EquivalenceCheck { source: n.inference_id, similarity: n.similarity, tokens: d.tokens.clone(), score });
        Ok(None)
    }
}
