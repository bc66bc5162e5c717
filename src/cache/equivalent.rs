//! EQUIVALENT decisions: whether a neighbour's answer A may be served for a new prompt P'
//! without decoding, judged by the model itself.
//!
//! The check: the model scores A under P' in one teacher-forced pass (prompt + answer, no
//! sampling), giving log p(A_i | P', A_<i) per token; A's log-probabilities under its own prompt
//! were recorded when A was computed (`inferences.response_logprobs`; the forward pass is batch
//! invariant, so a decode and a teacher-forced pass give the same bits). The [`Score`] is the
//! margin between the two: its mean over the tokens and its worst token. An answer the model
//! finds about as likely here as for its own question has margins near 0 or above.
//!
//! What counts as acceptable is learned at run time, without labels: every candidate that is not
//! served (and an exploration share of those that would be) is followed by the model's own
//! greedy answer F for P' (the VERIFIED path decodes it anyway), and the candidate counts as
//! acceptable when A's mean log-likelihood under P' is within `margin` nats per token of F's (or
//! A is F). A region of scores {mean >= m, worst >= w} serves only while the Wilson upper bound
//! of its error rate is <= `delta` — and never while it holds a rejected candidate: the region
//! stops below the highest rejection. With no rejections that needs n >= z²(1 - delta)/delta
//! acceptable observations (268 for 1% at 95%).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::trust::wilson_upper;
use crate::store::semantic::EquivalenceObservation;
use crate::store::{Store, StoreError};

/// User-set knobs of the EQUIVALENT mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EquivalentParams {
    /// Bound on the rate of served candidates that are not acceptable (default 1%).
    pub delta: f64,
    /// One-sided normal quantile of the confidence (1.645 = 95%).
    pub z: f64,
    /// A candidate is acceptable when its mean log-likelihood under the new prompt is at most
    /// this many nats per token below the fresh greedy answer's.
    pub margin: f64,
    /// Share of candidates inside the serving region that are decoded anyway (exploration), so
    /// the region keeps being tested and can move.
    pub explore: f64,
    /// Nearest neighbours scored per request (in one batch).
    pub candidates: usize,
    /// Answer tokens scored: the first `prefix` of the candidate (0: all of it). The score, the
    /// fresh answer's likelihood it is judged against, and so the learned region are all of this
    /// prefix: a store's observations are only comparable under one setting (change it with a
    /// fresh store). The whole candidate is served.
    pub prefix: usize,
}

impl Default for EquivalentParams {
    fn default() -> Self {
        EquivalentParams { delta: 0.01, z: 1.645, margin: 0.1, explore: 0.1, candidates: 1, prefix: 0 }
    }
}

/// How the model scores a candidate answer under a new prompt, against its own prompt.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Score {
    /// Mean over the tokens of log p(token | new prompt) - log p(token | own prompt), nats.
    pub mean_margin: f64,
    /// The smallest of those per-token margins.
    pub worst_margin: f64,
    /// Mean log p(token | new prompt): the candidate's log-likelihood per token here.
    pub candidate_ll: f64,
}

/// The score of a candidate from its log-probabilities under the new prompt (`here`) and its
/// own (`own`); `None` when they do not line up or are empty.
pub fn score(here: &[f32], own: &[f32]) -> Option<Score> {
    if here.is_empty() || here.len() != own.len() {
        return None;
    }
    let n = here.len() as f64;
    let margins = here.iter().zip(own).map(|(&h, &o)| f64::from(h) - f64::from(o));
    let (sum, worst) = margins.fold((0.0, f64::INFINITY), |(s, w), m| (s + m, w.min(m)));
    let candidate_ll = here.iter().map(|&h| f64::from(h)).sum::<f64>() / n;
    Some(Score { mean_margin: sum / n, worst_margin: worst, candidate_ll })
}

/// How many of an answer's `n` tokens are scored under `prefix` ([`EquivalentParams::prefix`]).
pub fn scored_len(n: usize, prefix: usize) -> usize {
    if prefix == 0 { n } else { n.min(prefix) }
}

/// Mean of log-probabilities (a fresh answer's log-likelihood per token); `None` when empty.
pub fn mean_ll(logprobs: &[f32]) -> Option<f64> {
    (!logprobs.is_empty()).then(|| logprobs.iter().map(|&x| f64::from(x)).sum::<f64>() / logprobs.len() as f64)
}

/// The label-free judgement: the candidate is acceptable for the new prompt when it is the
/// model's own greedy answer, or its likelihood per token is within `margin` of that answer's.
pub fn acceptable(same_tokens: bool, candidate_ll: f64, fresh_ll: f64, margin: f64) -> bool {
    same_tokens || candidate_ll >= fresh_ll - margin
}

/// Where candidates are served from: mean margin >= `mean`, worst margin >= `worst`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Region {
    /// Lowest mean per-token log-probability margin (here minus own) served from.
    pub mean: f64,
    /// Lowest worst (smallest) per-token margin served from.
    pub worst: f64,
    /// Observations inside it (all acceptable), and the Wilson bound of its error rate.
    pub n: usize,
    /// Wilson upper bound of the error rate over those `n` observations (none rejected).
    pub bound: f64,
}

impl Region {
    pub fn contains(&self, s: &Score) -> bool {
        s.mean_margin >= self.mean && s.worst_margin >= self.worst
    }
}

/// The widest region (most observations) of the form {mean >= m, worst >= w} holding no
/// rejected observation whose Wilson bound is <= delta. `obs`: (mean, worst, acceptable).
pub fn fit_region(obs: &[(f64, f64, bool)], p: &EquivalentParams) -> Option<Region> {
    let obs: Vec<(f64, f64, bool)> = obs.iter().copied().filter(|o| o.0.is_finite() && o.1.is_finite()).collect();
    // Candidate worst-margin floors: every distinct value, thinned to at most 64 quantiles.
    let mut worsts: Vec<f64> = obs.iter().map(|o| o.1).collect();
    worsts.sort_by(f64::total_cmp);
    worsts.dedup();
    let step = worsts.len().div_ceil(64).max(1);
    let floors: Vec<f64> = worsts.iter().copied().step_by(step).collect();
    let mut best: Option<Region> = None;
    for w in floors {
        let mut inside: Vec<(f64, bool)> = obs.iter().filter(|o| o.1 >= w).map(|o| (o.0, o.2)).collect();
        inside.sort_by(|a, b| b.0.total_cmp(&a.0));
        let mut n = 0;
        for (i, &(m, ok)) in inside.iter().enumerate() {
            if !ok {
                break;
            }
            n += 1;
            let last_of_value = inside.get(i + 1).is_none_or(|next| next.0 < m);
            let bound = wilson_upper(0, n, p.z);
            if last_of_value && bound <= p.delta && best.is_none_or(|b| n > b.n) {
                best = Some(Region { mean: m, worst: w, n, bound });
            }
        }
    }
    best
}

#[derive(Default)]
struct State {
    loaded: bool,
    obs: Vec<(f64, f64, bool)>,
    region: Option<Region>,
}

/// The learned decision, per tenant and model (loaded from `equivalence_outcomes` once).
pub struct EquivalentModel {
    /// The knobs the regions are fitted under.
    pub params: EquivalentParams,
    states: Mutex<HashMap<(String, String), State>>,
    /// Candidates seen inside a region (for the exploration share).
    inside: AtomicU64,
}

impl EquivalentModel {
    pub fn new(params: EquivalentParams) -> EquivalentModel {
        EquivalentModel { params, states: Mutex::new(HashMap::new()), inside: AtomicU64::new(0) }
    }

    fn with_state<T>(&self, store: &Store, tenant: &str, model_id: &str, f: impl FnOnce(&mut State) -> T) -> Result<T, StoreError> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let st = states.entry((tenant.to_string(), model_id.to_string())).or_default();
        if !st.loaded {
            // Judged again under this run's margin (the stored flag used the margin of its run;
            // a candidate equal to the fresh answer has candidate_ll == fresh_ll, bit for bit).
            let margin = self.params.margin;
            st.obs = store
                .equivalence_observations(tenant, model_id)?
                .into_iter()
                .map(|o| (o.mean_margin, o.worst_margin, acceptable(false, o.candidate_ll, o.fresh_ll, margin)))
                .collect();
            st.region = fit_region(&st.obs, &self.params);
            st.loaded = true;
        }
        Ok(f(st))
    }

    /// The serving region (`None`: not enough evidence yet) and the observations so far.
    pub fn region(&self, store: &Store, tenant: &str, model_id: &str) -> Result<(Option<Region>, usize), StoreError> {
        self.with_state(store, tenant, model_id, |s| (s.region, s.obs.len()))
    }

    /// Whether a candidate with score `s` is served: inside the region and not picked for
    /// exploration (every 1/explore-th candidate inside is decoded instead).
    pub fn serves(&self, store: &Store, tenant: &str, model_id: &str, s: &Score) -> Result<bool, StoreError> {
        let Some(region) = self.region(store, tenant, model_id)?.0 else { return Ok(false) };
        if !region.contains(s) {
            return Ok(false);
        }
        let k = self.inside.fetch_add(1, Ordering::Relaxed);
        let e = self.params.explore.clamp(0.0, 1.0);
        let explore = ((k + 1) as f64 * e).floor() > (k as f64 * e).floor();
        Ok(!explore)
    }

    /// Learns from one candidate whose fresh answer was decoded.
    pub fn observe(&self, store: &Store, tenant: &str, model_id: &str, o: &EquivalenceObservation) -> Result<(), StoreError> {
        let params = self.params;
        self.with_state(store, tenant, model_id, |s| {
            s.obs.push((o.mean_margin, o.worst_margin, o.acceptable));
            s.region = fit_region(&s.obs, &params);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_is_the_margin_between_the_two_prompts() {
        let s = score(&[-0.5, -1.0, -0.2], &[-0.5, -0.5, -0.1]).expect("score");
        assert!((s.mean_margin - (-0.6 / 3.0)).abs() < 1e-9, "{s:?}");
        assert!((s.worst_margin - (-0.5)).abs() < 1e-9);
        assert!((s.candidate_ll - (-1.7 / 3.0)).abs() < 1e-6);
        assert_eq!(score(&[-1.0], &[-1.0, -2.0]), None);
        assert_eq!(score(&[], &[]), None);
        assert!(acceptable(true, -9.0, -0.1, 0.1));
        assert!(acceptable(false, -0.55, -0.5, 0.1));
        assert!(!acceptable(false, -0.7, -0.5, 0.1));
    }

    #[test]
    fn region_needs_evidence_and_stops_below_rejections() {
        let p = EquivalentParams::default();
        // 200 acceptable observations: not enough for 1% at 95%.
        let few: Vec<(f64, f64, bool)> = (0..200).map(|i| (i as f64 * 1e-3, -1.0, true)).collect();
        assert_eq!(fit_region(&few, &p), None);
        // 300 acceptable with mean >= 0, rejections below: the region ends above the rejections.
        let mut obs: Vec<(f64, f64, bool)> = (0..300).map(|i| (i as f64 * 1e-3, -1.0, true)).collect();
        obs.extend((1..50).map(|i| (-(i as f64) * 1e-2, -1.0, false)));
        let r = fit_region(&obs, &p).expect("region");
        assert_eq!((r.mean, r.n), (0.0, 300));
        assert!(r.bound <= 0.01 && r.contains(&Score { mean_margin: 0.1, worst_margin: -1.0, candidate_ll: -1.0 }));
        assert!(!r.contains(&Score { mean_margin: -0.01, worst_margin: -1.0, candidate_ll: -1.0 }));
        // A rejection at the top, with a bad worst token: the region excludes it by the worst floor.
        obs.push((0.5, -5.0, false));
        let r = fit_region(&obs, &p).expect("region");
        assert!(r.worst > -5.0 && r.n == 300, "{r:?}");
        // A rejection at the top that nothing separates: no region at all.
        obs.push((0.6, -1.0, false));
        assert_eq!(fit_region(&obs, &p), None);
    }
}
