//! Token sampling, always on the CPU: greedy (temperature 0), or temperature + top-k + top-p
//! from a seeded generator (same seed and logits, same tokens). Buffers are allocated once.

/// Sampling parameters as a request gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no top-k cut.
    pub top_k: usize,
    /// 1.0 = no nucleus cut; must be in (0, 1].
    pub top_p: f32,
    /// None = seeded from the OS (not reproducible).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: None }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self::default()
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// The seeded generator sampling draws from (ground floor: synthetic models use it too).
pub use crate::rng::Rng;

/// The natural-log probability of `token` under the softmax of `logits` (the model's raw
/// distribution, temperature 1); when `token` is one of `stops`, of any stop token (every stop
/// ends the answer the same way). Deterministic: the same row gives the same bits.
///
/// Every cached generation records this for each token it chooses, on the engine thread, so it
/// must cost little beside a decode step: the normalizer sums [`exp_le0`] (an f32 exp written
/// to vectorize) in 16 lanes per 1,024-logit block, blocks added in f64; within 1e-5 nats of the
/// f64 reference over a 49,152-token vocabulary (unit test). Hand-written for speed (the libm
/// `exp` of every logit took ~0.3 ms a token, ~10 ms a 32-token answer).
pub fn log_prob(logits: &[f32], token: u32, stops: &[u32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for k in 0..LANES {
            lanes[k] = lanes[k].max(c[k]);
        }
    }
    let max = tail.iter().chain(&lanes).copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for block in logits.chunks(1024) {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let rest: f32 = chunks.remainder().iter().map(|&l| exp_le0(l - max)).sum();
        for c in chunks {
            for k in 0..LANES {
                acc[k] += exp_le0(c[k] - max);
            }
        }
        sum += f64::from(rest) + acc.iter().map(|&a| f64::from(a)).sum::<f64>();
    }
    // The token's own term in f64, unclamped: a scored answer's token may sit far below the max.
    let p = |t: u32| logits.get(t as usize).map_or(0.0, |&l| f64::from(l - max).exp());
    let mass = if stops.contains(&token) { stops.iter().map(|&t| p(t)).sum() } else { p(token) };
    (mass.ln() - sum.ln()) as f32
}

/// `e^x` for `x <= 0` (below -87, and for NaN, about `e^-87`): `2^(x log2 e)` as an exponent
/// and a degree-8 Taylor polynomial of `2^f`, `f` in (-1, 0] (relative error < 4e-7 + 1e-7·|x|:
/// the argument's f32 rounding grows with |x|; the terms that matter in a sum are near 0).
#[inline(always)]
fn exp_le0(x: f32) -> f32 {
    let t = x.max(-87.0).min(0.0) * std::f32::consts::LOG2_E;
    // SAFETY: t is finite and in [-125.6, 0], so it fits an i32.
    let n = unsafe { t.to_int_unchecked::<i32>() };
    let f = (t - n as f32) * std::f32::consts::LN_2;
    let mut p = 1.0 / 40320.0;
    for c in [1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p * f + c;
    }
    // 2^n with n in [-125, 0]: a normal f32.
    p * f32::from_bits(((n + 127) as u32) << 23)
}

/// Index of the largest logit (the lowest index among exact ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

pub struct Sampler {
    /// Temperature, top-k/top-p and seed settings.
    pub params: SamplingParams,
    rng: Rng,
    /// [vocab] (probability, token) candidates, reused across steps
    cand: Vec<(f32, u32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams, vocab_size: usize) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let rng = params.seed.map(Rng::new).unwrap_or_else(Rng::from_entropy);
        Ok(Sampler { params, rng, cand: Vec::with_capacity(vocab_size) })
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let keep = self.distribution(logits);
        let mass: f32 = self.cand[..keep].iter().map(|c| c.0).sum();
        self.pick(keep, mass, None)
    }

    /// Picks the next token when a draft proposes `draft` (speculative sampling with a draft
    /// that puts all its probability on one token): greedy keeps the argmax; otherwise the draft
    /// is accepted with probability p(draft) and, when rejected, the token is drawn from p with
    /// the draft removed. Either way the result is distributed exactly as [`Sampler::sample`]'s,
    /// so checking drafts never changes what a request can produce.
    pub fn verify(&mut self, logits: &[f32], draft: u32) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let keep = self.distribution(logits);
        let mass: f32 = self.cand[..keep].iter().map(|c| c.0).sum();
        let p_draft = self.cand[..keep].iter().find(|c| c.1 == draft).map_or(0.0, |c| c.0 / mass);
        if self.rng.next_f32() < p_draft {
            return draft;
        }
        let rest = mass - p_draft * mass;
        if rest <= 0.0 {
            return draft;
        }
        self.pick(keep, rest, Some(draft))
    }

    /// Fills `cand[..keep]` with unnormalized probabilities (temperature, top-k, top-p applied),
    /// in descending order; returns `keep`.
    fn distribution(&mut self, logits: &[f32]) -> usize {
        let p = self.params;
        self.cand.clear();
        self.cand.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        // Descending by logit, ties by token id: a total order, so results are reproducible.
        let by_logit = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = if p.top_k > 0 { p.top_k.min(self.cand.len()) } else { self.cand.len() };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(by_logit);
        let max = self.cand[0].0;
        let mut total = 0f32;
        for c in self.cand.iter_mut() {
            c.0 = ((c.0 - max) / p.temperature).exp();
            total += c.0;
        }
        // Nucleus: the smallest prefix whose probability reaches top_p.
        let mut keep = self.cand.len();
        if p.top_p < 1.0 {
            let mut acc = 0f32;
            for (i, c) in self.cand.iter().enumerate() {
                acc += c.0 / total;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        keep
    }

    /// Draws from `cand[..keep]` (total weight `mass`, not counting `skip`).
    fn pick(&mut self, keep: usize, mass: f32, skip: Option<u32>) -> u32 {
        let mut r = self.rng.next_f32() * mass;
        let mut last = self.cand[keep - 1].1;
        for c in self.cand[..keep].iter().filter(|c| Some(c.1) != skip) {
            if r < c.0 {
                return c.1;
            }
            r -= c.0;
            last = c.1;
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Time per call against the f64 reference (the implementation before), alternated in one
    /// process so both see the same load: `cargo test --release --lib -- --ignored
    /// log_prob_speed --nocapture`.
    #[test]
    #[ignore]
    fn log_prob_speed() {
        let mut rng = Rng::new(3);
        let logits: Vec<f32> = (0..49_152).map(|_| (rng.next_f32() - 0.5) * 20.0).collect();
        let reference = |logits: &[f32], t: usize| {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
            f64::from(logits[t] - max) - sum.ln()
        };
        let (mut fast, mut slow, mut sink) = (Vec::new(), Vec::new(), 0.0f64);
        for round in 0..200 {
            let t = std::time::Instant::now();
            sink += f64::from(log_prob(&logits, round, &[]));
            fast.push(t.elapsed().as_secs_f64() * 1e6);
            let t = std::time::Instant::now();
            sink += reference(&logits, round as usize);
            slow.push(t.elapsed().as_secs_f64() * 1e6);
        }
        fast.sort_by(f64::total_cmp);
        slow.sort_by(f64::total_cmp);
        println!("49,152 logits, median of 200: log_prob {:.1} us, f64 reference {:.1} us ({:.1}x) [{sink:.1}]", fast[100], slow[100], slow[100] / fast[100]);
    }

    #[test]
    fn log_prob_matches_the_f64_reference() {
        let reference = |logits: &[f32], t: usize| {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
            f64::from(logits[t] - max) - sum.ln()
        };
        let mut rng = Rng::new(7);
        for (vocab, scale) in [(49_152, 4.0f32), (49_152, 30.0), (1_000, 0.01), (17, 200.0)] {
            let logits: Vec<f32> = (0..vocab).map(|_| (rng.next_f32() - 0.5) * scale).collect();
            for t in [0, vocab / 3, vocab - 1] {
                let (got, want) = (f64::from(log_prob(&logits, t as u32, &[])), reference(&logits, t));
                assert!((got - want).abs() < 1e-5, "vocab {vocab} scale {scale} token {t}: {got} vs {want}");
            }
        }
        for x in [0.0f32, -1e-3, -0.5, -1.0, -7.3, -40.0, -86.9] {
            let (got, want) = (f64::from(exp_le0(x)), f64::from(x).exp());
            assert!((got / want - 1.0).abs() < 4e-7 + 1e-7 * f64::from(x.abs()), "exp({x}) = {got}, want {want}");
        }
        assert!(exp_le0(-1e9) > 0.0 && exp_le0(-1e9) < 1e-37 && exp_le0(f32::NAN) < 1e-37);
        // Any stop token counts: two equal stop logits double the mass.
        let logits = [0.0f32, 1.0, 1.0];
        assert!((log_prob(&logits, 1, &[1, 2]) - log_prob(&logits, 1, &[]) - std::f32::consts::LN_2).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax_lowest_tie() {
        let mut s = Sampler::new(SamplingParams::greedy(), 4).expect("params");
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.9, seed: Some(42) };
        let run = || {
            let mut s = Sampler::new(p, 100).expect("params");
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        let other = {
            let mut s = Sampler::new(SamplingParams { seed: Some(43), ..p }, 100).expect("params");
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_ne!(run(), other);
    }

    #[test]
    fn top_k_and_top_p_restrict_the_support() {
        let logits = [5.0, 4.0, 3.0, 0.0, -1.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, top_p: 1.0, seed: Some(1) }, 5).expect("p");
        assert!((0..500).map(|_| s.sample(&logits)).all(|t| t < 2));
        // p(0) ≈ 0.66 with temperature 1: top_p 0.5 keeps only token 0.
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.5, seed: Some(1) }, 5).expect("p");
        assert!((0..500).map(|_| s.sample(&logits)).all(|t| t == 0));
        // Without cuts every token appears eventually, in rough proportion.
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: Some(3) }, 5).expect("p");
        let mut counts = [0; 5];
        for _ in 0..20000 {
            counts[s.sample(&logits) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert!((counts[0] as f32 / 20000.0 - 0.6612).abs() < 0.02, "{counts:?}");
    }

    #[test]
    fn verifying_a_draft_keeps_the_distribution() {
        let logits = [2.0, 1.0, 0.5, -1.0];
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: Some(7) };
        let n = 40000;
        let (mut plain, mut checked) = ([0usize; 4], [0usize; 4]);
        let mut s = Sampler::new(p, 4).expect("params");
        for _ in 0..n {
            plain[s.sample(&logits) as usize] += 1;
        }
        let mut s = Sampler::new(p, 4).expect("params");
        for i in 0..n {
            // Drafts that are often wrong must not shift the distribution.
            checked[s.verify(&logits, (i % 4) as u32) as usize] += 1;
        }
        for t in 0..4 {
            let (a, b) = (plain[t] as f64 / n as f64, checked[t] as f64 / n as f64);
            assert!((a - b).abs() < 0.012, "token {t}: plain {a:.4} vs verified {b:.4}");
        }
        let mut g = Sampler::new(SamplingParams::greedy(), 4).expect("params");
        assert_eq!(g.verify(&logits, 2), 0, "greedy keeps the argmax whatever the draft");
        // A draft outside the top-k support is always rejected.
        let mut s = Sampler::new(SamplingParams { top_k: 2, ..p }, 4).expect("params");
        assert!((0..2000).all(|_| s.verify(&logits, 3) < 2));
    }

    #[test]
    fn bad_params_are_errors() {
        let p = |t: f32, tp: f32| SamplingParams { temperature: t, top_p: tp, ..Default::default() }.validate();
        assert_eq!(p(-0.1, 1.0), Err(SamplingError::Temperature(-0.1)));
        assert!(p(f32::NAN, 1.0).is_err());
        assert_eq!(p(0.5, 0.0), Err(SamplingError::TopP(0.0)));
        assert!(p(0.5, 1.5).is_err());
        assert!(p(0.0, 1.0).is_ok());
    }
}
