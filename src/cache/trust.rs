//! TRUST decisions: from the outcomes of verified checks (similarity of the nearest neighbour,
//! and whether its answer turned out to be exactly the model's), the lowest similarity above
//! which the error rate is bounded by `delta` with the chosen confidence.
//!
//! For each candidate threshold t (every observed similarity), the outcomes at or above t are a
//! sample of what TRUST would have served there; the Wilson score upper bound of their error
//! rate must be <= delta. The lowest such t is chosen (the most recall); with too little evidence
//! there is none and every request falls back to VERIFIED, which produces more evidence. With
//! zero errors the bound needs n >= z² (1 - delta) / delta outcomes: 268 for delta = 1% at 95%.

use crate::store::semantic::SemanticEvidence;

/// User-set error bound and confidence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrustParams {
    /// Bound on the rate of served answers that differ from the model's (default 1%).
    pub delta: f64,
    /// One-sided normal quantile of the confidence (1.645 = 95%).
    pub z: f64,
}

impl Default for TrustParams {
    fn default() -> Self {
        TrustParams { delta: 0.01, z: 1.645 }
    }
}

/// Wilson score upper bound of a binomial proportion (`errors` of `n`).
pub fn wilson_upper(errors: usize, n: usize, z: f64) -> f64 {
    if n == 0 {
        return 1.0;
    }
    let (n, p) = (n as f64, errors as f64 / n as f64);
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let spread = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre + spread) / (1.0 + z2 / n)).min(1.0)
}

/// The lowest similarity whose outcomes at or above it have an error bound <= delta.
pub fn fit_threshold(outcomes: &[(f64, bool)], p: &TrustParams) -> Option<f64> {
    let mut sorted: Vec<(f64, bool)> = outcomes.iter().copied().filter(|o| o.0.is_finite()).collect();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut n, mut errors, mut best) = (0, 0, None);
    for (i, &(sim, correct)) in sorted.iter().enumerate() {
        n += 1;
        errors += usize::from(!correct);
        // Only between distinct similarities: a threshold takes all outcomes at its value.
        let last_of_value = sorted.get(i + 1).is_none_or(|next| next.0 < sim);
        if last_of_value && wilson_upper(errors, n, p.z) <= p.delta {
            best = Some(sim);
        }
    }
    best
}

/// Semantic reuse of one tenant (or all, `*`), for `forge-cache stats`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SemanticStats {
    /// The tenant, or `*` for all of them pooled.
    pub tenant: String,
    /// Draft tokens fed to the engine from nearest neighbours.
    pub draft_tokens: u64,
    /// Draft tokens the engine accepted.
    pub draft_accepted: u64,
    /// Verifications of a nearest neighbour's answer, and how many found it exactly right.
    pub checks: u64,
    /// Checks that found the neighbour's answer exactly right.
    pub checks_correct: u64,
    /// TRUST under the given parameters: the similarity it serves from (None: not enough
    /// evidence), the outcomes at or above it, the wrong ones among them, and the Wilson upper
    /// bound of the false-hit rate there.
    pub trust_threshold: Option<f64>,
    /// Checks at or above `trust_threshold`.
    pub trust_outcomes: u64,
    /// Of those, the ones whose neighbour's answer was wrong.
    pub trust_wrong: u64,
    /// Wilson upper bound of the false-hit rate above the threshold (None: no threshold).
    pub trust_false_hit_bound: Option<f64>,
}

/// TRUST's statistics on the store's raw evidence: per tenant (sorted), then `*` (the pooled
/// evidence) when `all_tenants` and there are several.
pub fn semantic_stats(ev: &SemanticEvidence, all_tenants: bool, p: &TrustParams) -> Vec<SemanticStats> {
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
    let mut names: Vec<String> = ev.drafts.keys().chain(ev.outcomes.keys()).cloned().collect();
    names.sort();
    names.dedup();
    let mut out: Vec<SemanticStats> = names
        .iter()
        .map(|t| build(t.clone(), ev.drafts.get(t).copied().unwrap_or_default(), ev.outcomes.get(t).map_or(&[][..], |v| v)))
        .collect();
    if all_tenants && out.len() > 1 {
        let d = ev.drafts.values().fold((0, 0), |a, x| (a.0 + x.0, a.1 + x.1));
        // TRUST learns per tenant; the total shows the pooled evidence.
        let all: Vec<(f64, bool)> = ev.outcomes.values().flatten().copied().collect();
        out.push(build("*".into(), d, &all));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_bound_matches_known_values() {
        // 0 errors of 268 at 95%: just under 1%.
        assert!(wilson_upper(0, 268, 1.645) <= 0.01);
        assert!(wilson_upper(0, 250, 1.645) > 0.01);
        assert!((wilson_upper(5, 100, 1.96) - 0.1118).abs() < 1e-3);
        assert_eq!(wilson_upper(0, 0, 1.645), 1.0);
    }

    #[test]
    fn threshold_needs_evidence_and_stops_before_errors() {
        let p = TrustParams::default();
        // 100 correct outcomes: not enough for 1% at 95%.
        let few: Vec<(f64, bool)> = (0..100).map(|i| (0.9 + i as f64 * 1e-4, true)).collect();
        assert_eq!(fit_threshold(&few, &p), None);
        // 400 correct above 0.95, errors below: the threshold lands above the errors.
        let mut many: Vec<(f64, bool)> = (0..400).map(|i| (0.95 + i as f64 * 1e-4, true)).collect();
        many.extend((0..50).map(|i| (0.80 + i as f64 * 1e-3, false)));
        let t = fit_threshold(&many, &p).expect("threshold");
        assert!((0.95..0.96).contains(&t), "{t}");
        // A looser bound admits more.
        let loose = fit_threshold(&many, &TrustParams { delta: 0.2, z: 1.645 }).expect("threshold");
        assert!(loose < t);
        // An error at the top makes the highest similarities need more evidence, never less.
        let mut top_error = many.clone();
        top_error.push((0.999, false));
        assert!(fit_threshold(&top_error, &p).is_none_or(|t2| t2 >= t));
    }
}
