//! Fair shares of the engine, as pure functions the scheduler calls: which waiting request gets
//! a free slot ([`pick`]), how much work one step may hold ([`StepClock`]), and how that work
//! is split between decoding sequences and prompt chunks ([`split`]).
//!
//! Work is counted in *units*: one unit is one token's matmuls; attention adds
//! `1 / ATTENTION_KEYS_PER_UNIT` of a unit per earlier position the token attends to. So a
//! prompt chunk at position 7,000 costs ~15 units per token and one at position 0 one unit, and
//! a step's budget in units is about a fixed wall time at any position. The clock turns the
//! measured time per unit into a budget so that a step takes about `step_time`: a request that
//! arrives waits at most about one step before its prompt starts, however long the prompt in
//! flight is.
//!
//! A step's budget goes first to one token of every decoding sequence, then to prompt chunks
//! (and draft windows): an equal share per tenant (a tenant needing less leaves the rest to the
//! others), within a tenant the shortest remaining prompt first, the tenant's oldest prompt
//! always getting at least a quarter of the tenant's share so it keeps moving. The step's token
//! limit is shared the same way (it binds instead of the budget when a unit is cheap). A short request
//! is therefore prefilled in the step after it arrives even while a long prompt of its own or
//! another tenant is being prefilled, and a tenant with many long prompts gets no more of the
//! engine than one with a single request.

use std::time::Duration;

/// Positions attended to that cost as much as one token's matmuls. Measured on SmolLM2-135M
/// on the CPU backend (a 64-token chunk at position 7,680 took ~15x one at position 0); the
/// clock corrects the overall scale, this constant only weighs long against short contexts.
pub const ATTENTION_KEYS_PER_UNIT: f64 = 512.0;

/// The part of a step kept for prompt chunks even when decoding sequences use the budget.
const MIN_PREFILL_SHARE: f64 = 0.25;

/// The part of a tenant's share its oldest waiting prompt always gets.
const OLDEST_FLOOR: f64 = 0.25;

/// A tenant needing at most this many units gets them even when its equal share is smaller
/// (many tenants with long prompts): a short chat prompt goes in one step, so its first token
/// comes a step later however many long prompts of other tenants are in flight. Bounded, so a
/// tenant sending only short requests still cannot take more than this from the others.
const SHORT_FLOOR: f64 = 48.0;

/// Cost in units of feeding `n` tokens at positions `pos..pos + n` (each attends to itself and
/// every earlier position).
pub fn cost(pos: usize, n: usize) -> f64 {
    let (p, n) = (pos as f64, n as f64);
    n + (n * p + n * (n + 1.0) / 2.0) / ATTENTION_KEYS_PER_UNIT
}

/// The most tokens (at most `max`) that can be fed from position `pos` within `units`.
pub fn tokens_within(pos: usize, units: f64, max: usize) -> usize {
    if units <= 0.0 || max == 0 {
        return 0;
    }
    // cost(pos, n) = a n^2 + b n with a = 1 / 2K, b = 1 + (pos + 1/2) / K.
    let k = ATTENTION_KEYS_PER_UNIT;
    let (a, b) = (0.5 / k, 1.0 + (pos as f64 + 0.5) / k);
    let guess = ((-b + (b * b + 4.0 * a * units).sqrt()) / (2.0 * a)).floor().max(0.0) as usize;
    let mut n = guess.min(max);
    while n > 0 && cost(pos, n) > units {
        n -= 1;
    }
    while n < max && cost(pos, n + 1) <= units {
        n += 1;
    }
    n
}

/// What one active sequence could feed this step.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    /// The fairness key (tenant) of its request.
    pub tenant: &'a str,
    /// Positions already in its KV cache (where the next token goes).
    pub pos: usize,
    /// Tokens it could feed now: 1 for a decoding sequence, the rest of the prompt plus the
    /// draft window for a prefilling one.
    pub tokens: usize,
    /// Tokens of its prompt still to feed (0: decoding); orders a tenant's prompts.
    pub prompt_left: usize,
}

impl Want<'_> {
    fn decoding(&self) -> bool {
        self.prompt_left == 0 && self.tokens == 1
    }
}

/// Tokens each sequence feeds this step (same order as `wants`, which is arrival order):
/// every decoding sequence its token, then prompt chunks within `budget` units (see the module
/// docs), `max_tokens` in all. Every step with any prompt to feed feeds at least one token of
/// it, so nothing stalls however small the budget.
pub fn split(wants: &[Want<'_>], budget: f64, max_tokens: usize) -> Vec<usize> {
    let mut parts = vec![0; wants.len()];
    let (mut used, mut tokens) = (0.0, 0);
    for (i, w) in wants.iter().enumerate() {
        if w.decoding() && tokens < max_tokens {
            parts[i] = 1;
            used += cost(w.pos, 1);
            tokens += 1;
        }
    }
    let prefill: Vec<usize> = (0..wants.len()).filter(|&i| !wants[i].decoding() && wants[i].tokens > 0).collect();
    if prefill.is_empty() || tokens >= max_tokens {
        return parts;
    }
    let pool = (budget - used).max(budget * MIN_PREFILL_SHARE);

    // Tenants in order of first arrival, with what all their prompts would cost (units, tokens).
    let mut tenants: Vec<(&str, f64, usize)> = Vec::new();
    for &i in &prefill {
        let w = &wants[i];
        let c = cost(w.pos, w.tokens);
        match tenants.iter_mut().find(|(t, _, _)| *t == w.tenant) {
            Some((_, d, n)) => {
                *d += c;
                *n += w.tokens;
            }
            None => tenants.push((w.tenant, c, w.tokens)),
        }
    }
    // Water-filling: equal shares, smallest demand first (a demand up to SHORT_FLOOR is met
    // whole while the pool lasts); a tenant needing less than its share leaves the rest.
    let mut by_demand: Vec<usize> = (0..tenants.len()).collect();
    by_demand.sort_by(|&a, &b| tenants[a].1.total_cmp(&tenants[b].1));
    let mut allowance = vec![0.0; tenants.len()];
    let mut left = pool;
    for (k, &t) in by_demand.iter().enumerate() {
        let equal = left / (by_demand.len() - k) as f64;
        let share = if tenants[t].1 <= SHORT_FLOOR { tenants[t].1.min(left) } else { equal };
        allowance[t] = tenants[t].1.min(share);
        left -= allowance[t];
    }

    // The step's token limit is shared the same way: smallest demand first, a short demand
    // whole, else an equal share of what is left, so tenants that arrived earlier cannot use
    // it all up when the unit budget is the looser of the two limits.
    for (k, &t) in by_demand.iter().enumerate() {
        let (tenant, _, wanted) = tenants[t];
        let left = max_tokens - tokens;
        let cap = if wanted as f64 <= SHORT_FLOOR { wanted.min(left) } else { left / (by_demand.len() - k) };
        let end = tokens + cap;
        let mine: Vec<usize> = prefill.iter().copied().filter(|&i| wants[i].tenant == tenant).collect();
        let mut units = allowance[t];
        let give = |i: usize, units: &mut f64, parts: &mut [usize], tokens: &mut usize| {
            let w = &wants[i];
            let n = tokens_within(w.pos + parts[i], *units, (w.tokens - parts[i]).min(end - *tokens));
            *units -= cost(w.pos + parts[i], n);
            parts[i] += n;
            *tokens += n;
        };
        if mine.len() > 1 {
            let mut floor = units * OLDEST_FLOOR;
            give(mine[0], &mut floor, &mut parts, &mut tokens);
            units -= units * OLDEST_FLOOR - floor;
        }
        let mut srpt = mine.clone();
        srpt.sort_by_key(|&i| wants[i].prompt_left.max(1));
        for i in srpt {
            give(i, &mut units, &mut parts, &mut tokens);
        }
    }
    if tokens < max_tokens && prefill.iter().all(|&i| parts[i] == 0) {
        // Too small a budget for even one token: the shortest prompt moves by one.
        let &i = prefill.iter().min_by_key(|&&i| wants[i].prompt_left).expect("not empty");
        parts[i] = 1;
    }
    parts
}

/// Which waiting request to admit: `None` when no slot is free for any of them. `waiting` are
/// the tenants of the waiting requests in arrival order, `running` those of the active
/// sequences. The tenant with the fewest running sequences goes first (the earliest of its
/// requests); with more than one slot, the last free slot goes only to a tenant with nothing
/// running, so one tenant can never take every slot and make the others wait for its
/// sequences to end.
pub fn pick<'a>(waiting: impl IntoIterator<Item = &'a str>, running: &[&str], max_active: usize) -> Option<usize> {
    let free = max_active.saturating_sub(running.len());
    if free == 0 {
        return None;
    }
    let load = |t: &str| running.iter().filter(|&&r| r == t).count();
    let (i, n) = waiting.into_iter().enumerate().map(|(i, t)| (i, load(t))).min_by_key(|&(i, n)| (n, i))?;
    (free > 1 || max_active == 1 || n == 0).then_some(i)
}

/// Turns the measured time per unit into a step budget of about `step_time`.
#[derive(Debug, Clone)]
pub struct StepClock {
    step_time: f64,
    /// Seconds per unit, smoothed over recent steps.
    per_unit: f64,
}

impl StepClock {
    /// Steps smaller than this many units carry too much fixed cost (the weights are read once
    /// per step) to say what a unit costs, unless they used most of a small budget (see
    /// [`StepClock::observe`]).
    const MIN_SAMPLE_UNITS: f64 = 16.0;
    /// Weight of the newest sample when it says a unit got cheaper.
    const SMOOTHING: f64 = 0.3;
    /// Weight of the newest sample when it says a unit got dearer: a step that overran its
    /// time (attention growing late in a long prompt, another process taking a core) shrinks
    /// the next one at once, so a request waiting for the step to end waits about one step.
    const SMOOTHING_UP: f64 = 0.6;

    pub fn new(step_time: Duration) -> StepClock {
        // A first guess (a unit is ~1-3 ms on 2 CPU cores for SmolLM2); corrected after one step.
        StepClock { step_time: step_time.as_secs_f64().max(1e-3), per_unit: 2e-3 }
    }

    /// Units the next step may hold (at least `floor`).
    pub fn budget(&self, floor: f64) -> f64 {
        (self.step_time / self.per_unit).max(floor)
    }

    /// A step of `units`, given `budget`, took `elapsed`. A step that filled at least half its
    /// budget always counts: otherwise a budget once shrunk below [`Self::MIN_SAMPLE_UNITS`] (a
    /// stall of the machine) would never be observed again and never grow back.
    pub fn observe(&mut self, units: f64, budget: f64, elapsed: Duration) {
        if units >= Self::MIN_SAMPLE_UNITS || (units > 0.0 && units >= 0.5 * budget) {
            let sample = elapsed.as_secs_f64() / units;
            let weight = if sample > self.per_unit { Self::SMOOTHING_UP } else { Self::SMOOTHING };
            self.per_unit += weight * (sample - self.per_unit);
        }
    }
}

/// Fits a step's time as `a + b·units` over recent steps (least squares, older steps forgotten
/// geometrically), to say what one more row costs against a step of one: `b / (a + b)`. A
/// draft token fed is such a row; an accepted one saves such a step, so drafts pay when their
/// acceptance exceeds it (`cache::skip`).
#[derive(Debug, Clone, Default)]
pub struct RowCost {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
}

impl RowCost {
    /// Weight kept by the sums at each new step (about the last 500 steps count).
    const KEEP: f64 = 0.998;
    /// Steps before the fit says anything.
    const MIN_STEPS: f64 = 32.0;

    /// A step of `units` took `elapsed`.
    pub fn observe(&mut self, units: f64, elapsed: Duration) {
        let (x, y) = (units, elapsed.as_secs_f64());
        if !(x.is_finite() && y.is_finite() && x > 0.0) {
            return;
        }
        let k = Self::KEEP;
        *self = RowCost { n: k * self.n + 1.0, sx: k * self.sx + x, sy: k * self.sy + y, sxx: k * self.sxx + x * x, sxy: k * self.sxy + x * y };
    }

    /// `b / (a + b)`: one more row's cost as a share of a one-row step. `None` until enough
    /// steps of different sizes were seen, or when the fit is not a fixed cost plus a positive
    /// cost per unit.
    pub fn row_share(&self) -> Option<f64> {
        if self.n < Self::MIN_STEPS {
            return None;
        }
        let (mx, my) = (self.sx / self.n, self.sy / self.n);
        let var = self.sxx / self.n - mx * mx;
        // Steps must differ in size by a few units for a slope to mean anything.
        if var < 1.0 {
            return None;
        }
        let b = (self.sxy / self.n - mx * my) / var;
        let a = my - b * mx;
        (a > 0.0 && b > 0.0).then(|| b / (a + b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(tenant: &str, pos: usize, left: usize) -> Want<'_> {
        Want { tenant, pos, tokens: left, prompt_left: left }
    }

    fn decode(tenant: &str, pos: usize) -> Want<'_> {
        Want { tenant, pos, tokens: 1, prompt_left: 0 }
    }

    #[test]
    fn cost_and_its_inverse() {
        assert_eq!(cost(0, 0), 0.0);
        assert!((cost(0, 1) - (1.0 + 1.0 / ATTENTION_KEYS_PER_UNIT)).abs() < 1e-12);
        // Late in a long prompt a token costs many units.
        assert!(cost(7_680, 1) > 15.0);
        for pos in [0, 100, 4_000, 8_000] {
            for units in [0.5, 1.0, 17.0, 64.0, 1_000.0] {
                let n = tokens_within(pos, units, 10_000);
                assert!(cost(pos, n) <= units);
                assert!(cost(pos, n + 1) > units, "pos {pos} units {units}: {n} is not the most");
            }
        }
        assert_eq!(tokens_within(0, 1e9, 64), 64);
    }

    #[test]
    fn a_short_prompt_is_fed_whole_beside_a_long_one() {
        // The long prompt arrived first and is deep into its prefill; a 40-token prompt arrives.
        for tenant in ["a", "b"] {
            let wants = [prefill("a", 6_000, 2_000), prefill(tenant, 0, 40)];
            let parts = split(&wants, 128.0, 128);
            assert_eq!(parts[1], 40, "the short prompt is fed in one step (tenant {tenant}): {parts:?}");
            assert!(parts[0] >= 1, "the long one keeps moving: {parts:?}");
            assert!(wants.iter().zip(&parts).map(|(w, &n)| cost(w.pos, n)).sum::<f64>() <= 128.0 + 1e-9);
        }
    }

    #[test]
    fn a_short_prompt_is_fed_whole_beside_many_long_ones_of_other_tenants() {
        let wants = [prefill("a", 7_000, 1_000), prefill("b", 7_000, 1_000), prefill("c", 7_000, 1_000), prefill("d", 7_000, 1_000), prefill("e", 0, 40)];
        let parts = split(&wants, 120.0, 128);
        assert_eq!(parts[4], 40, "{parts:?}");
        assert!(parts[..4].iter().all(|&n| n >= 1), "every long one keeps moving: {parts:?}");
    }

    #[test]
    fn a_short_prompt_is_fed_whole_when_the_token_limit_binds() {
        // A budget far above the step's token limit (fast kernels): the long and the medium
        // prompt, which arrived first, must not take all 128 tokens (the short one waited 11
        // steps, over a second, in the service's fairness test before this was so).
        let wants = [prefill("big", 768, 7_232), prefill("third", 0, 704), prefill("small", 0, 36)];
        let parts = split(&wants, 375.0, 128);
        assert_eq!(parts[2], 36, "{parts:?}");
        assert_eq!(parts.iter().sum::<usize>(), 128, "the limit is used whole: {parts:?}");
        assert!(parts[0] >= 40 && parts[1] >= 40, "the other two share the rest: {parts:?}");
        // The earlier tenants' equal token shares, whatever their arrival order.
        let wants = [prefill("a", 0, 5_000), prefill("b", 0, 5_000)];
        assert_eq!(split(&wants, 1e9, 128), vec![64, 64]);
    }

    #[test]
    fn decoding_sequences_always_get_their_token() {
        let wants = [prefill("a", 0, 5_000), decode("b", 30), decode("c", 7_000), decode("a", 12)];
        let parts = split(&wants, 40.0, 64);
        assert_eq!(&parts[1..], &[1, 1, 1]);
        assert!(parts[0] > 0 && parts[0] <= 61);
        // The token limit of the run state holds.
        let parts = split(&wants, 1e9, 64);
        assert_eq!(parts.iter().sum::<usize>(), 64);
        // Even a budget used up by decoding leaves prompts room to move.
        let parts = split(&wants, 2.0, 64);
        assert!(parts[0] >= 1, "{parts:?}");
    }

    #[test]
    fn tenants_share_equally_whatever_their_number_of_prompts() {
        // Tenant a has three long prompts, b one: b gets half the budget, not a quarter.
        let wants = [prefill("a", 0, 1_000), prefill("a", 0, 1_000), prefill("a", 0, 1_000), prefill("b", 0, 1_000)];
        let parts = split(&wants, 100.0, 1_000);
        let a: usize = parts[..3].iter().sum();
        assert!((45..=50).contains(&parts[3]), "{parts:?}");
        assert!((45..=50).contains(&a), "{parts:?}");
        // A tenant needing less leaves the rest to the others.
        let wants = [prefill("a", 0, 1_000), prefill("b", 0, 10)];
        let parts = split(&wants, 100.0, 1_000);
        assert_eq!(parts[1], 10);
        assert!(parts[0] >= 80, "{parts:?}");
    }

    #[test]
    fn a_tenants_oldest_prompt_keeps_moving_under_a_stream_of_short_ones() {
        let wants = [prefill("a", 500, 3_000), prefill("a", 0, 60), prefill("a", 0, 60)];
        let parts = split(&wants, 100.0, 1_000);
        assert!(parts[0] >= 10, "the oldest gets at least a quarter: {parts:?}");
        assert!(parts[1] == 60, "then the shortest: {parts:?}");
    }

    #[test]
    fn admission_goes_to_the_least_served_tenant_and_keeps_a_slot() {
        // One slot free, tenant a already runs: a's request waits, b's is admitted.
        assert_eq!(pick(["a", "b"], &["a"; 7], 8), Some(1));
        assert_eq!(pick(["a", "a"], &["a"; 7], 8), None, "the last slot is kept for another tenant");
        assert_eq!(pick(["a"], &["a"; 6], 8), Some(0));
        assert_eq!(pick(["a"], &["a"; 8], 8), None);
        // Fewest running first, then the earliest.
        assert_eq!(pick(["a", "b", "c"], &["a", "b", "b"], 8), Some(2));
        assert_eq!(pick(["b", "a"], &["a", "b"], 8), Some(0));
        // One slot in all: it is used.
        assert_eq!(pick(["a"], &[], 1), Some(0));
        assert_eq!(pick(std::iter::empty(), &[], 8), None);
    }

    #[test]
    fn the_clock_aims_at_the_step_time() {
        let mut c = StepClock::new(Duration::from_millis(200));
        for _ in 0..30 {
            // 5 ms per unit.
            let units = c.budget(1.0);
            c.observe(units, units, Duration::from_secs_f64(units * 5e-3));
        }
        assert!((c.budget(1.0) - 40.0).abs() < 1.0, "{}", c.budget(1.0));
        // Tiny steps (a few decoding tokens in a large budget) say nothing.
        c.observe(2.0, 40.0, Duration::from_secs(1));
        assert!((c.budget(1.0) - 40.0).abs() < 1.0);
        assert_eq!(c.budget(100.0), 100.0);
        // A step that took twice its time shrinks the next one at once (not by a third of the
        // way); a faster one grows it gently.
        c.observe(40.0, 40.0, Duration::from_millis(400));
        assert!(c.budget(1.0) < 40.0 / 1.5, "{}", c.budget(1.0));
        // A stall that shrank the budget below the sample minimum: the small steps that fill it
        // are observed, and the budget grows back once steps are fast again.
        c.observe(20.0, 20.0, Duration::from_secs(4));
        let low = c.budget(1.0);
        assert!(low < 10.0, "{low}");
        for _ in 0..30 {
            let units = c.budget(1.0);
            c.observe(units, units, Duration::from_secs_f64(units * 5e-3));
        }
        assert!((c.budget(1.0) - 40.0).abs() < 1.0, "the budget grew back from {low}: {}", c.budget(1.0));
        let mut d = StepClock::new(Duration::from_millis(200));
        for _ in 0..30 {
            let units = d.budget(1.0);
            d.observe(units, units, Duration::from_secs_f64(units * 5e-3));
        }
        d.observe(40.0, 40.0, Duration::from_millis(100));
        assert!(d.budget(1.0) < 40.0 * 1.5, "{}", d.budget(1.0));
    }

    #[test]
    fn row_cost_recovers_fixed_and_per_row_costs() {
        let mut r = RowCost::default();
        assert_eq!(r.row_share(), None);
        // 3 ms per step plus 1 ms per unit: one more row is 1 / (3 + 1) of a one-row step.
        for i in 0..200 {
            let units = [1.0, 1.0, 1.0, 5.0, 33.0][i % 5];
            r.observe(units, Duration::from_secs_f64(3e-3 + 1e-3 * units));
        }
        let share = r.row_share().expect("fitted");
        assert!((share - 0.25).abs() < 1e-6, "{share}");
        // Steps all of one size say nothing about a row.
        let mut same = RowCost::default();
        for _ in 0..100 {
            same.observe(1.0, Duration::from_millis(4));
        }
        assert_eq!(same.row_share(), None);
    }
}
