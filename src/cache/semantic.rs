//! The semantic tier: answers of similar earlier questions, found by embedding (all-MiniLM-L6-v2)
//! and sqlite-vec KNN within a scope (tenant, model, everything in the prompt but the question).
//!
//! Similarity alone cannot tell a paraphrase from a near-miss ("open on Sundays?" vs "closed on
//! Sundays?" are closer than two real paraphrases), so a neighbour's answer is never trusted by
//! default: it becomes a *draft* that the model checks token by token (VERIFIED, see
//! `engine::scheduler`). TRUST serves without the model only when [`TrustModel`] — fitted on
//! what verification found out about earlier neighbours — bounds the error rate by `delta`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::indexer::IdleFn;
use crate::background::Background;
use crate::backend::Backend;
use crate::embed::{EmbedError, Embedder};
use crate::vocab::StopReason;
use crate::engine::scheduler::Draft;
use crate::store::semantic::{Neighbour, Outcome};
use crate::store::{Store, StoreError};

use super::equivalent::{EquivalentModel, EquivalentParams};
use super::skip::{DraftGate, SkipParams};
use super::trust::{fit_threshold, TrustParams};

#[derive(Debug, Clone, Copy)]
pub struct SemanticConfig {
    /// Neighbours fetched per lookup.
    pub k: usize,
    /// Neighbours less similar than this are not worth a draft.
    pub min_similarity: f64,
    /// Candidate answers handed to the engine as drafts.
    pub max_drafts: usize,
    /// The TRUST mode's knobs.
    pub trust: TrustParams,
    /// The EQUIVALENT mode's knobs.
    pub equivalent: EquivalentParams,
    /// VERIFIED's draft skipping (see [`DraftGate`]).
    pub skip: SkipParams,
}

impl Default for SemanticConfig {
    fn default() -> Self {
        SemanticConfig {
            k: 4,
            min_similarity: 0.5,
            max_drafts: 3,
            trust: TrustParams::default(),
            equivalent: EquivalentParams::default(),
            skip: SkipParams::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SemanticError {
    #[error("embedding the question: {0}")]
    Embed(#[from] EmbedError),
    #[error("the sentence embedder did not load: {0}")]
    NotLoaded(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Per tenant and model: every outcome so far and the threshold fitted on them.
#[derive(Default)]
struct TrustState {
    loaded: bool,
    outcomes: Vec<(f64, bool)>,
    threshold: Option<f64>,
}

/// Decides when a neighbour may be served without the model.
pub struct TrustModel {
    params: TrustParams,
    states: Mutex<HashMap<(String, String), TrustState>>,
}

impl TrustModel {
    pub fn new(params: TrustParams) -> TrustModel {
        TrustModel { params, states: Mutex::new(HashMap::new()) }
    }

    fn with_state<T>(&self, store: &Store, tenant: &str, model_id: &str, f: impl FnOnce(&mut TrustState) -> T) -> Result<T, StoreError> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let st = states.entry((tenant.to_string(), model_id.to_string())).or_default();
        if !st.loaded {
            st.outcomes = store.outcomes(tenant, model_id)?.into_iter().map(|o| (o.similarity, o.correct)).collect();
            st.threshold = fit_threshold(&st.outcomes, &self.params);
            st.loaded = true;
        }
        Ok(f(st))
    }

    /// The similarity from which neighbours are trusted (`None`: not enough evidence yet), and
    /// how many outcomes it rests on.
    pub fn threshold(&self, store: &Store, tenant: &str, model_id: &str) -> Result<(Option<f64>, usize), StoreError> {
        self.with_state(store, tenant, model_id, |s| (s.threshold, s.outcomes.len()))
    }

    /// Whether `n` may be served as the answer without running the model.
    pub fn trusts(&self, store: &Store, tenant: &str, model_id: &str, n: &Neighbour) -> Result<bool, StoreError> {
        let Some(t) = self.threshold(store, tenant, model_id)?.0 else { return Ok(false) };
        if n.similarity < t {
            return Ok(false);
        }
        // Per entry: an answer once found wrong for a question at least this similar is not trusted.
        Ok(store.lowest_wrong_similarity(n.inference_id)?.is_none_or(|wrong| n.similarity > wrong))
    }

    /// Learns from one verification of a nearest neighbour.
    pub fn observe(&self, store: &Store, tenant: &str, model_id: &str, o: &Outcome) -> Result<(), StoreError> {
        let params = self.params;
        self.with_state(store, tenant, model_id, |s| {
            s.outcomes.push((o.similarity, o.correct));
            s.threshold = fit_threshold(&s.outcomes, &params);
        })
    }
}

/// The sentence embedder, possibly still loading on its own thread: a service answers exact
/// hits and facts before it is ready, and the first call that needs it waits for it.
#[derive(Clone)]
pub struct LazyEmbedder(Background<Arc<Embedder>>);

impl LazyEmbedder {
    /// Runs `load` on a new thread; [`LazyEmbedder::get`] waits for it.
    pub fn load_in_background(load: impl FnOnce() -> Result<Embedder, String> + Send + 'static) -> std::io::Result<LazyEmbedder> {
        Background::spawn("forge-embedder-load", move || load().map(Arc::new)).map(LazyEmbedder)
    }

    /// The embedder, once loaded (waits while it loads).
    pub fn get(&self) -> Result<&Arc<Embedder>, SemanticError> {
        self.0.get().map_err(|e| SemanticError::NotLoaded(e.to_string()))
    }
}

impl From<Arc<Embedder>> for LazyEmbedder {
    fn from(e: Arc<Embedder>) -> LazyEmbedder {
        LazyEmbedder(Background::ready(e))
    }
}

/// The semantic tier: embedder, neighbour search, drafts, trust.
pub struct SemanticCache {
    embedder: LazyEmbedder,
    /// A wider backend (the engine's thread team) for a question's embedding, used while the
    /// closure says it is free; the embedder's own (one thread) otherwise.
    idle_backend: Option<(Arc<dyn Backend>, Arc<IdleFn>)>,
    store: Arc<Store>,
    /// The semantic cache's settings.
    pub config: SemanticConfig,
    /// TRUST's learned similarity thresholds.
    pub trust: TrustModel,
    /// EQUIVALENT's learned serving regions.
    pub equivalent: EquivalentModel,
    /// Decides whether a neighbour is worth handing to the engine as a draft.
    pub drafts: DraftGate,
}

impl SemanticCache {
    pub fn new(embedder: impl Into<LazyEmbedder>, store: Arc<Store>, config: SemanticConfig) -> SemanticCache {
        SemanticCache {
            embedder: embedder.into(),
            idle_backend: None,
            store,
            config,
            trust: TrustModel::new(config.trust),
            equivalent: EquivalentModel::new(config.equivalent),
            drafts: DraftGate::new(config.skip),
        }
    }

    /// Questions are embedded on `backend` whenever `idle()` holds (the vectors are bitwise the
    /// same either way: the CPU kernels do not depend on the thread count).
    pub fn with_idle_backend(mut self, backend: Arc<dyn Backend>, idle: Arc<IdleFn>) -> SemanticCache {
        self.idle_backend = Some((backend, idle));
        self
    }

    /// A question's embedding: on the idle backend when it is free.
    pub fn embed(&self, text: &str) -> Result<Vec<f32>, SemanticError> {
        let e = match &self.idle_backend {
            Some((backend, idle)) if idle() => self.embedder.get()?.embed_on(backend.as_ref(), text)?,
            _ => self.embedder.get()?.embed(text)?,
        };
        Ok(e.vector)
    }

    /// Neighbours of an embedded question in `scope`, most similar first.
    pub fn neighbours(&self, scope: &str, embedding: &[f32]) -> Result<Vec<Neighbour>, SemanticError> {
        Ok(self.store.nearest_answers(scope, embedding, self.config.k, self.config.min_similarity)?)
    }

    /// Embeds (in one batch) the content of at most `limit` facts of `tenant` not embedded yet,
    /// oldest first; returns how many.
    pub fn index_new_facts(&self, tenant: &str, limit: usize) -> Result<usize, SemanticError> {
        let facts = self.store.unindexed_facts(tenant, limit)?;
        let texts: Vec<&str> = facts.iter().map(|(_, c)| c.as_str()).collect();
        for ((id, _), e) in facts.iter().zip(self.embedder.get()?.embed_batch(&texts)?) {
            self.store.index_fact(tenant, *id, &e.vector)?;
        }
        Ok(facts.len())
    }
}

/// The scope of a question request: tenant, model and the prompt rendered around a placeholder
/// question. Two requests are neighbours only when everything but the question is the same.
pub fn scope(tenant: &str, model_id: &str, prompt_without_question: &str) -> String {
    let mut h = Sha256::new();
    for part in [tenant, model_id, prompt_without_question] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The tokens the model would emit for `n`'s answer: its tokens plus the stop token when it
/// ended on one.
pub fn draft_of(n: &Neighbour, stop_id: Option<u32>) -> Draft {
    let mut tokens = n.response_tokens.clone();
    if let (StopReason::Stop, Some(stop)) = (n.stop_reason, stop_id) {
        tokens.push(stop);
    }
    Draft { tokens, source: n.inference_id, similarity: n.similarity }
}

/// Whether serving `n` verbatim could equal the model's answer under `max_tokens`: it ended on
/// its own within the budget, or it was cut at exactly this budget.
pub fn fits_budget(n: &Neighbour, max_tokens: usize) -> bool {
    match n.stop_reason {
        StopReason::Stop => n.response_tokens.len() < max_tokens,
        StopReason::Length => n.response_tokens.len() == max_tokens && n.max_tokens == max_tokens,
        _ => false,
    }
}
