//! VERIFIED's draft skipping: drafts cost prefill rows the model checks and throws away when it
//! disagrees, so where drafts have not paid they are not offered. Outcomes of earlier checks
//! (`semantic_outcomes`: the nearest neighbour's similarity, draft tokens fed, accepted) are
//! grouped by similarity band; a band whose acceptance (accepted / fed) over at least
//! `min_outcomes` checks is below `floor` gets no drafts, except for an exploration share
//! (`explore`) so the band's acceptance keeps being measured and the decision can change.
//! Skipping changes no output: a request without drafts is decoded exactly as BYPASS would.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::store::{Store, StoreError};

/// Draft-skipping knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkipParams {
    /// Acceptance (accepted / fed draft tokens) below which a band's drafts are skipped.
    pub floor: f64,
    /// Checks a band needs before it may be skipped.
    pub min_outcomes: usize,
    /// Share of requests in a skipped band that still get drafts.
    pub explore: f64,
    /// Width of a similarity band.
    pub band: f64,
    /// `false`: never skip (every request with neighbours gets drafts).
    pub enabled: bool,
}

impl Default for SkipParams {
    fn default() -> Self {
        SkipParams { floor: 0.25, min_outcomes: 8, explore: 0.1, band: 0.05, enabled: true }
    }
}

#[derive(Default)]
struct Bands {
    loaded: bool,
    /// band index → (outcomes, draft tokens fed, accepted).
    by_band: HashMap<i64, (usize, u64, u64)>,
}

/// Per tenant and model: whether the nearest neighbour at this similarity is worth a draft.
pub struct DraftGate {
    pub params: SkipParams,
    states: Mutex<HashMap<(String, String), Bands>>,
    skipped: AtomicU64,
}

impl DraftGate {
    pub fn new(params: SkipParams) -> DraftGate {
        DraftGate { params, states: Mutex::new(HashMap::new()), skipped: AtomicU64::new(0) }
    }

    fn band(&self, similarity: f64) -> i64 {
        (similarity / self.params.band.max(1e-6)).floor() as i64
    }

    fn with_bands<T>(&self, store: &Store, tenant: &str, model_id: &str, f: impl FnOnce(&mut Bands) -> T) -> Result<T, StoreError> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let st = states.entry((tenant.to_string(), model_id.to_string())).or_default();
        if !st.loaded {
            for (sim, fed, accepted) in store.draft_outcomes(tenant, model_id)? {
                let e = st.by_band.entry(self.band(sim)).or_default();
                *e = (e.0 + 1, e.1 + fed, e.2 + accepted);
            }
            st.loaded = true;
        }
        Ok(f(st))
    }

    /// The measured acceptance of `similarity`'s band and the checks behind it.
    pub fn acceptance(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64) -> Result<(Option<f64>, usize), StoreError> {
        let b = self.band(similarity);
        self.with_bands(store, tenant, model_id, |s| {
            let (n, fed, acc) = s.by_band.get(&b).copied().unwrap_or_default();
            ((fed > 0).then(|| acc as f64 / fed as f64), n)
        })
    }

    /// Whether to offer drafts for a nearest neighbour at `similarity`.
    pub fn offer(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64) -> Result<bool, StoreError> {
        if !self.params.enabled {
            return Ok(true);
        }
        let (acc, n) = self.acceptance(store, tenant, model_id, similarity)?;
        let low = n >= self.params.min_outcomes && acc.is_none_or(|a| a < self.params.floor);
        if !low {
            return Ok(true);
        }
        let k = self.skipped.fetch_add(1, Ordering::Relaxed);
        let e = self.params.explore.clamp(0.0, 1.0);
        Ok(((k + 1) as f64 * e).floor() > (k as f64 * e).floor())
    }

    /// Learns from one check of the nearest neighbour's draft.
    pub fn observe(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64, fed: usize, accepted: usize) -> Result<(), StoreError> {
        let b = self.band(similarity);
        self.with_bands(store, tenant, model_id, |s| {
            let e = s.by_band.entry(b).or_default();
            *e = (e.0 + 1, e.1 + fed as u64, e.2 + accepted as u64);
        })
    }
}
