//! The cache tiers, in order, as calls into `cache/` and the store: FACT (a live user-provided
//! fact filed under the question), EXACT (the recorded answer to the same key), then the
//! semantic tier — TRUST serves a neighbour's answer when its learned bound allows, else the
//! neighbours' answers become drafts the engine verifies (VERIFIED / PARTIAL). Which tiers a
//! request may use follows its cache mode.

use std::time::Instant;

use super::error::ServiceError;
use super::record::Answer;
use super::validation::Plan;
use super::Pipeline;
use crate::cache::semantic::{draft_of, fits_budget};
use crate::engine::scheduler::Draft;
use crate::vocab::{CacheMode, ServedFrom, StopReason};

/// What the caches found for a request.
pub(crate) enum Found {
    Answer(Answer),
    /// Candidate answers for the engine to verify.
    Drafts(Vec<Draft>),
    Nothing,
}

impl Pipeline {
    /// FACT, then EXACT, then the semantic tier. Blocking (store, embedding).
    pub(crate) fn lookup(&self, plan: &mut Plan) -> Result<Found, ServiceError> {
        if !matches!(plan.mode, CacheMode::Auto | CacheMode::Verified | CacheMode::Trust | CacheMode::Exact) {
            return Ok(Found::Nothing);
        }
        if let Some(q) = &plan.question {
            if let Some(fact) = self.store.fact_answer(&plan.tenant, q)? {
                let tokens = self.tokenizer.encode(&fact.content, false).map_err(|e| ServiceError::Internal(e.to_string()))?;
                let saved = plan.prompt_ids.len() + tokens.len();
                let mut a = Answer::stored(ServedFrom::Fact, fact.content, tokens, StopReason::Stop, saved);
                a.source_fact_id = Some(fact.id);
                return Ok(Found::Answer(a));
            }
        }
        if let Some(key) = &plan.cache_key {
            if let Some(hit) = self.exact.get(&plan.tenant, key)? {
                let mut a = Answer::stored(ServedFrom::Exact, hit.response.clone(), hit.response_tokens.clone(), hit.stop_reason, hit.tokens_computed);
                a.source_inference_id = Some(hit.inference_id);
                return Ok(Found::Answer(a));
            }
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
        if comparable {
            plan.top = Some(top.clone());
        }
        let stop = self.tokenizer.stop_ids().first().copied();
        Ok(Found::Drafts(neighbours.iter().take(sem.config.max_drafts).map(|n| draft_of(n, stop)).collect()))
    }
}
