//! VERIFIED's draft skipping: drafts cost prefill rows the model checks and throws away when it
//! disagrees, so where drafts have not paid they are not offered. Outcomes of earlier checks
//! (`semantic_outcomes`: the nearest neighbour's similarity, draft tokens fed, accepted) are
//! grouped by similarity band.
//!
//! * **Floor.** Drafts pay when the decode steps that accepted tokens save cost more than the
//!   rows fed: with a step costing `a + b·rows`, acceptance must exceed `b / (a + b)`, the share
//!   of a one-row step that one more row adds. The engine measures it
//!   ([`crate::engine::scheduler::Scheduler::draft_row_share`]); until it has, or with
//!   `learn_floor` off, the fixed `floor` is used.
//! * **Pooled prior.** A band with fewer than `min_outcomes` checks is judged by its own checks
//!   shrunk toward the tenant's pooled acceptance (worth `min_outcomes` checks), once the pool
//!   holds `min_outcomes` checks; before that every band is learning and gets drafts.
//! * **Replay.** A skipped greedy request still tells the gate what its drafts would have done:
//!   under greedy decoding the model's choices are the answer's tokens, so the scheduler's
//!   bookkeeping replays exactly on the answer ([`crate::engine::scheduler::replay_drafts`]).
//!   Such requests need no exploration: every one of them is observed, at no cost.
//! * **Exploration.** Requests whose outcome cannot be replayed (sampled, or the neighbour's
//!   answer does not fit the budget) get drafts in a skipped band at the `explore` share, so the
//!   band's acceptance keeps being measured and the decision can change.
//! * **Skipping the lookup.** Where the gate skips drafts at every similarity, a greedy
//!   request's lookup can only file its question and replay drafts nobody will be given, while
//!   the embedding, the search, the recording and the answer's log-probabilities are CPU the
//!   model's decode competes with. Only a `lookup_explore` share of such requests look up (so
//!   the gate keeps learning, through their replays, and can turn); the rest skip the semantic
//!   tier (`pipeline::deferred`). What this changes: the skipped questions are not filed, so
//!   they are nobody's neighbour later (for any mode of the tenant), and the gate and TRUST see
//!   only the exploring share's outcomes.
//!
//! Skipping changes no output: a request without drafts is decoded exactly as BYPASS would.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::store::{Store, StoreError};

/// Draft-skipping knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkipParams {
    /// Acceptance (accepted / fed draft tokens) below which a band's drafts are skipped, while
    /// the engine has not measured a row's cost (or always, with `learn_floor` off).
    pub floor: f64,
    /// Use the engine's measured row share as the floor once it has one.
    pub learn_floor: bool,
    /// Checks a band (or, for the pooled prior, the tenant) needs before it may be skipped.
    pub min_outcomes: usize,
    /// Share of requests in a skipped band that still get drafts when their outcome cannot be
    /// replayed.
    pub explore: f64,
    /// Share of greedy requests of a tenant whose gate skips drafts at every similarity that
    /// still run the semantic lookup (embed the question, search, file it, replay the skipped
    /// drafts). The others skip the semantic tier altogether: no embedding, no search, nothing
    /// filed, no answer log-probabilities — their question is not a neighbour for later
    /// requests, and the gate and TRUST learn only from the exploring share. 1.0: every
    /// request looks up (as before this knob).
    pub lookup_explore: f64,
    /// Width of a similarity band.
    pub band: f64,
    /// `false`: never skip (every request with neighbours gets drafts).
    pub enabled: bool,
}

impl Default for SkipParams {
    fn default() -> Self {
        SkipParams { floor: 0.25, learn_floor: true, min_outcomes: 8, explore: 0.1, lookup_explore: 0.1, band: 0.05, enabled: true }
    }
}

/// Checks, draft tokens fed and accepted: of one band, or pooled over a tenant's bands.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Checks (draft outcomes) counted.
    pub checks: usize,
    /// Draft tokens fed to the engine.
    pub fed: u64,
    /// Draft tokens the engine accepted.
    pub accepted: u64,
}

impl Tally {
    fn add(&mut self, fed: u64, accepted: u64) {
        *self = Tally { checks: self.checks + 1, fed: self.fed + fed, accepted: self.accepted + accepted };
    }
}

/// The acceptance a band is judged by: its own once it has `min` checks, else its checks
/// shrunk toward the pooled acceptance (a prior worth `min` average checks) once the pool has
/// `min` checks; `None` while both are too young (learning: drafts are offered).
pub fn estimate(band: Tally, pooled: Tally, min: usize) -> Option<f64> {
    let ratio = |acc: f64, fed: f64| if fed > 0.0 { acc / fed } else { 0.0 };
    if band.checks >= min.max(1) {
        return Some(ratio(band.accepted as f64, band.fed as f64));
    }
    if pooled.checks < min.max(1) {
        return None;
    }
    let w = min as f64 / pooled.checks as f64;
    Some(ratio(band.accepted as f64 + w * pooled.accepted as f64, band.fed as f64 + w * pooled.fed as f64))
}

/// Counts one more event on `counter`; true for a `share` of them, evenly spread (the first
/// true after `1 / share` events).
fn every_nth(counter: &AtomicU64, share: f64) -> bool {
    let k = counter.fetch_add(1, Ordering::Relaxed);
    let e = share.clamp(0.0, 1.0);
    ((k + 1) as f64 * e).floor() > (k as f64 * e).floor()
}

/// What the gate decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Drafts are offered (the band pays, is learning, or this request explores).
    Offer,
    /// No drafts.
    Skip,
}

#[derive(Default)]
struct Bands {
    loaded: bool,
    by_band: HashMap<i64, Tally>,
    pooled: Tally,
}

/// Per tenant and model: whether the nearest neighbour at this similarity is worth a draft.
pub struct DraftGate {
    /// The knobs the gate decides under.
    pub params: SkipParams,
    states: Mutex<HashMap<(String, String), Bands>>,
    skipped: AtomicU64,
    lookups: AtomicU64,
}

impl DraftGate {
    pub fn new(params: SkipParams) -> DraftGate {
        DraftGate { params, states: Mutex::new(HashMap::new()), skipped: AtomicU64::new(0), lookups: AtomicU64::new(0) }
    }

    fn band(&self, similarity: f64) -> i64 {
        (similarity / self.params.band.max(1e-6)).floor() as i64
    }

    fn with_bands<T>(&self, store: &Store, tenant: &str, model_id: &str, f: impl FnOnce(&mut Bands) -> T) -> Result<T, StoreError> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let st = states.entry((tenant.to_string(), model_id.to_string())).or_default();
        if !st.loaded {
            for (sim, fed, accepted) in store.draft_outcomes(tenant, model_id)? {
                st.by_band.entry(self.band(sim)).or_default().add(fed, accepted);
                st.pooled.add(fed, accepted);
            }
            st.loaded = true;
        }
        Ok(f(st))
    }

    /// The floor in use: the engine's measured row share (`row_share`) when learning it, else
    /// the fixed one.
    pub fn floor(&self, row_share: Option<f64>) -> f64 {
        match row_share {
            Some(r) if self.params.learn_floor && r.is_finite() => r.clamp(0.01, 0.99),
            _ => self.params.floor,
        }
    }

    /// The acceptance `similarity`'s band is judged by ([`estimate`]), its own tally and the
    /// tenant's pooled one.
    pub fn acceptance(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64) -> Result<(Option<f64>, Tally, Tally), StoreError> {
        let b = self.band(similarity);
        let min = self.params.min_outcomes;
        self.with_bands(store, tenant, model_id, |s| {
            let band = s.by_band.get(&b).copied().unwrap_or_default();
            (estimate(band, s.pooled, min), band, s.pooled)
        })
    }

    /// Whether to offer drafts for a nearest neighbour at `similarity`. `replayable`: the
    /// request's outcome will be replayed on its answer if skipped (greedy, comparable), so it
    /// never needs to explore. `row_share`: the engine's measured cost of a row (see the module).
    pub fn offer(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64, replayable: bool, row_share: Option<f64>) -> Result<Gate, StoreError> {
        if !self.params.enabled || self.params.floor <= 0.0 {
            return Ok(Gate::Offer);
        }
        let (acc, _, _) = self.acceptance(store, tenant, model_id, similarity)?;
        Ok(self.decide(acc, replayable, row_share))
    }

    /// Whether a replayable request would be skipped whatever its nearest neighbour's
    /// similarity: the pool has its evidence and every band's acceptance (a band without checks
    /// is judged by the pooled prior) is below the floor. Such a request's lookup cannot give it
    /// drafts, so it may wait until the first token (`pipeline::deferred`).
    pub fn skips_everywhere(&self, store: &Store, tenant: &str, model_id: &str, row_share: Option<f64>) -> Result<bool, StoreError> {
        if !self.params.enabled || self.params.floor <= 0.0 {
            return Ok(false);
        }
        let floor = self.floor(row_share);
        let min = self.params.min_outcomes;
        self.with_bands(store, tenant, model_id, |s| {
            let below = |band: Tally| estimate(band, s.pooled, min).is_some_and(|a| a < floor);
            below(Tally::default()) && s.by_band.values().all(|&b| below(b))
        })
    }

    /// For a request whose drafts are skipped everywhere ([`DraftGate::skips_everywhere`]):
    /// whether it still looks up (every `1 / lookup_explore`-th such request, evenly spread).
    pub fn explores_lookup(&self) -> bool {
        every_nth(&self.lookups, self.params.lookup_explore)
    }

    fn decide(&self, acc: Option<f64>, replayable: bool, row_share: Option<f64>) -> Gate {
        let floor = self.floor(row_share);
        match acc {
            None => Gate::Offer,
            Some(a) if a >= floor => Gate::Offer,
            Some(_) if replayable => Gate::Skip,
            Some(_) if every_nth(&self.skipped, self.params.explore) => Gate::Offer,
            Some(_) => Gate::Skip,
        }
    }

    /// Learns from one check (or replay) of the nearest neighbour's draft.
    pub fn observe(&self, store: &Store, tenant: &str, model_id: &str, similarity: f64, fed: usize, accepted: usize) -> Result<(), StoreError> {
        let b = self.band(similarity);
        self.with_bands(store, tenant, model_id, |s| {
            s.by_band.entry(b).or_default().add(fed as u64, accepted as u64);
            s.pooled.add(fed as u64, accepted as u64);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(checks: usize, fed: u64, accepted: u64) -> Tally {
        Tally { checks, fed, accepted }
    }

    #[test]
    fn skips_everywhere_only_when_every_band_and_the_prior_are_below_the_floor() {
        let dir = std::env::temp_dir().join(format!("forge-skip-everywhere-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Store::open(dir.join("s.db")).unwrap();
        let gate = DraftGate::new(SkipParams { learn_floor: false, floor: 0.25, min_outcomes: 2, ..SkipParams::default() });
        assert!(!gate.skips_everywhere(&store, "t", "m", None).unwrap(), "no evidence: learning");
        for _ in 0..4 {
            gate.observe(&store, "t", "m", 0.81, 100, 5).unwrap();
        }
        assert!(gate.skips_everywhere(&store, "t", "m", None).unwrap(), "every band at 5% < 25%");
        for _ in 0..2 {
            gate.observe(&store, "t", "m", 0.97, 100, 90).unwrap();
        }
        assert!(!gate.skips_everywhere(&store, "t", "m", None).unwrap(), "the 0.95 band pays: its requests get drafts");
        let off = DraftGate::new(SkipParams { enabled: false, ..SkipParams::default() });
        assert!(!off.skips_everywhere(&store, "t", "m", None).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn young_bands_learn_until_the_pool_has_evidence() {
        assert_eq!(estimate(tally(0, 0, 0), tally(7, 300, 20), 8), None, "pool too young: learning");
        assert_eq!(estimate(tally(3, 120, 100), tally(3, 120, 100), 8), None);
        // A band with its own evidence is judged by it alone.
        assert_eq!(estimate(tally(8, 100, 50), tally(100, 4000, 200), 8), Some(0.5));
        assert_eq!(estimate(tally(8, 0, 0), tally(8, 0, 0), 8), Some(0.0), "nothing fed counts as nothing accepted");
    }

    #[test]
    fn the_pooled_prior_judges_young_bands_and_yields_to_their_evidence() {
        let pooled = tally(40, 1600, 96); // 6% acceptance, 40 tokens a check
        // An empty band takes the pool's acceptance.
        let e = estimate(tally(0, 0, 0), pooled, 8).expect("prior");
        assert!((e - 0.06).abs() < 1e-12, "{e}");
        // A young band that accepted everything it saw moves well above the pool.
        let e = estimate(tally(4, 160, 160), pooled, 8).expect("prior");
        assert!((e - (160.0 + 19.2) / (160.0 + 320.0)).abs() < 1e-12, "{e}");
        assert!(e > 0.3);
        // One that accepted nothing stays below it.
        assert!(estimate(tally(4, 160, 0), pooled, 8).expect("prior") < 0.06);
    }

    #[test]
    fn the_floor_is_the_measured_row_share_when_learned() {
        let g = DraftGate::new(SkipParams::default());
        assert_eq!(g.floor(None), 0.25);
        assert_eq!(g.floor(Some(0.38)), 0.38);
        assert_eq!(g.floor(Some(f64::NAN)), 0.25);
        assert_eq!(g.floor(Some(2.0)), 0.99);
        let fixed = DraftGate::new(SkipParams { learn_floor: false, ..SkipParams::default() });
        assert_eq!(fixed.floor(Some(0.38)), 0.25);
        // A band at 30% acceptance pays with the fixed floor, not when a row costs 38% of a step.
        assert_eq!(g.decide(Some(0.30), true, None), Gate::Offer);
        assert_eq!(g.decide(Some(0.30), true, Some(0.38)), Gate::Skip);
        assert_eq!(g.decide(Some(0.40), true, Some(0.38)), Gate::Offer);
        assert_eq!(g.decide(None, true, Some(0.38)), Gate::Offer, "learning");
    }

    #[test]
    fn lookups_explore_at_their_share_evenly() {
        let g = DraftGate::new(SkipParams { lookup_explore: 0.1, ..SkipParams::default() });
        let picks: Vec<usize> = (0..40).filter(|_| g.explores_lookup()).collect();
        assert_eq!(picks, vec![9, 19, 29, 39], "every tenth request looks up");
        let all = DraftGate::new(SkipParams { lookup_explore: 1.0, ..SkipParams::default() });
        assert!((0..5).all(|_| all.explores_lookup()));
        let none = DraftGate::new(SkipParams { lookup_explore: 0.0, ..SkipParams::default() });
        assert!(!(0..50).any(|_| none.explores_lookup()));
    }

    #[test]
    fn only_requests_that_cannot_be_replayed_explore() {
        let g = DraftGate::new(SkipParams { explore: 0.25, ..SkipParams::default() });
        let replayed: Vec<Gate> = (0..40).map(|_| g.decide(Some(0.05), true, None)).collect();
        assert!(replayed.iter().all(|&d| d == Gate::Skip), "a replayed request never needs drafts to be observed");
        let sampled = (0..40).filter(|_| g.decide(Some(0.05), false, None) == Gate::Offer).count();
        assert_eq!(sampled, 10, "a quarter of the others explore");
        let none = DraftGate::new(SkipParams { explore: 0.0, ..SkipParams::default() });
        assert!((0..40).all(|_| none.decide(Some(0.05), false, None) == Gate::Skip));
    }
    #[test]
    fn the_gate_learns_from_the_store_and_from_observations() {
        use crate::store::inferences::tests::sample;
        use crate::store::semantic::Outcome;
        use crate::vocab::{CacheMode, ServedFrom};
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path().join("g.db")).expect("open");
        let src = store.record_inference(&sample("t", Some("k"), ServedFrom::Model, CacheMode::Auto)).expect("record");
        // Eight earlier checks at similarity 0.62 accepted 2 of 40 tokens each (5%).
        for _ in 0..8 {
            let id = store.record_inference(&sample("t", None, ServedFrom::Model, CacheMode::Auto)).expect("record");
            let o = Outcome { source_inference_id: src, similarity: 0.62, correct: false };
            store.record_outcome("t", "m", id, &o, 40, 2).expect("outcome");
        }
        let g = DraftGate::new(SkipParams::default());
        // Loaded from the store: the band is skipped, and so is a young band (the pooled prior).
        assert_eq!(g.offer(&store, "t", "m", 0.63, true, None).expect("offer"), Gate::Skip);
        assert_eq!(g.offer(&store, "t", "m", 0.97, true, None).expect("offer"), Gate::Skip);
        // Another tenant knows nothing yet: learning.
        assert_eq!(g.offer(&store, "u", "m", 0.63, true, None).expect("offer"), Gate::Offer);
        // The 0.95 band turns out to accept most of its drafts (checked or replayed): offered.
        for _ in 0..4 {
            g.observe(&store, "t", "m", 0.97, 30, 27).expect("observe");
        }
        let (acc, band, pooled) = g.acceptance(&store, "t", "m", 0.97).expect("acceptance");
        assert_eq!((band.checks, pooled.checks), (4, 12));
        assert!(acc.is_some_and(|a| a > 0.25), "{acc:?}");
        assert_eq!(g.offer(&store, "t", "m", 0.97, true, None).expect("offer"), Gate::Offer);
        assert_eq!(g.offer(&store, "t", "m", 0.63, true, None).expect("offer"), Gate::Skip);
        // A disabled gate always offers.
        let off = DraftGate::new(SkipParams { enabled: false, ..SkipParams::default() });
        assert_eq!(off.offer(&store, "t", "m", 0.63, true, None).expect("offer"), Gate::Offer);
    }
}
