//! Speed measurements in llama-bench's terms, so the two print comparable tables:
//! `ppN` = prefill of N tokens from an empty cache (one batch, logits of the last token),
//! `tgN` = N one-token decode steps from an empty cache, `tgN@dD` = the same after D tokens of
//! context. Token ids are pseudo-random; every test runs once untimed, then `reps` times.
//! [`decode_bytes`] is what one decode step reads (weights and KV), for the bandwidth floor.

use std::time::Instant;

use super::generate::prefill;
use super::model::{Logits, Model, ModelError, RunState, SeqBatch};
use super::sampler::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchTest {
    Prefill { n: usize },
    Decode { n: usize, depth: usize },
}

impl BenchTest {
    pub fn name(&self) -> String {
        match *self {
            BenchTest::Prefill { n } => format!("pp{n}"),
            BenchTest::Decode { n, depth: 0 } => format!("tg{n}"),
            BenchTest::Decode { n, depth } => format!("tg{n}@d{depth}"),
        }
    }

    /// The default set: pp128, pp512, pp4096, tg128 and the depth sweep tg128@d1024,
    /// tg128@d4096.
    pub fn defaults() -> Vec<BenchTest> {
        vec![
            BenchTest::Prefill { n: 128 },
            BenchTest::Prefill { n: 512 },
            BenchTest::Prefill { n: 4096 },
            BenchTest::Decode { n: 128, depth: 0 },
            BenchTest::Decode { n: 128, depth: 1024 },
            BenchTest::Decode { n: 128, depth: 4096 },
        ]
    }

    /// Parses a name as [`BenchTest::name`] prints it (`pp4096`, `tg128`, `tg64@d2048`), so
    /// `--only` may name tests outside the default set.
    pub fn parse(name: &str) -> Option<BenchTest> {
        let num = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0);
        if let Some(n) = name.strip_prefix("pp") {
            return num(n).map(|n| BenchTest::Prefill { n });
        }
        let rest = name.strip_prefix("tg")?;
        match rest.split_once("@d") {
            Some((n, d)) => Some(BenchTest::Decode { n: num(n)?, depth: d.parse().ok()? }),
            None => num(rest).map(|n| BenchTest::Decode { n, depth: 0 }),
        }
    }

    /// Tokens of context a decode step of this test sees on average (depth + half the run);
    /// `None` for prefill.
    pub fn mean_context(&self) -> Option<usize> {
        match *self {
            BenchTest::Prefill { .. } => None,
            BenchTest::Decode { n, depth } => Some(depth + n / 2),
        }
    }

    fn tokens(&self) -> usize {
        match *self {
            BenchTest::Prefill { n } | BenchTest::Decode { n, .. } => n,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    /// Test name (`pp512`, `tg128`, `tg128@d2048`).
    pub test: String,
    /// Mean over the repetitions.
    pub tokens_per_s: f64,
    /// Standard deviation of tokens/s over the repetitions.
    pub stddev: f64,
    /// Timed repetitions (after the untimed warm-up runs).
    pub reps: usize,
    /// Untimed warm-up runs before them ([`warm_up`]).
    pub warmup: usize,
}

/// Warm-up runs at most, and seconds of them at most (then the timed runs start anyway).
const WARMUP_MAX_RUNS: usize = 8;
const WARMUP_MAX_S: f64 = 30.0;
/// Two consecutive warm-up runs agree when their times differ by at most this fraction.
const WARMUP_AGREE: f64 = 0.05;

/// Untimed runs of `test` until two consecutive ones agree within [`WARMUP_AGREE`] (at least
/// two runs; at most [`WARMUP_MAX_RUNS`] or [`WARMUP_MAX_S`] seconds): one run was not enough,
/// the first wgpu pp512 of a process read ~4x low on the H100 (pipelines, allocations and clocks
/// still settling after it). Returns the number of runs.
fn warm_up(model: &Model, state: &mut RunState, test: BenchTest) -> Result<usize, ModelError> {
    let start = Instant::now();
    let mut last = run_once(model, state, test)?;
    let mut runs = 1;
    while runs < WARMUP_MAX_RUNS && start.elapsed().as_secs_f64() < WARMUP_MAX_S {
        let t = run_once(model, state, test)?;
        runs += 1;
        if (t - last).abs() <= WARMUP_AGREE * t.max(last) {
            break;
        }
        last = t;
    }
    Ok(runs)
}

fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// Seconds of one run of `test` (context filling for depth is not timed).
fn run_once(model: &Model, state: &mut RunState, test: BenchTest) -> Result<f64, ModelError> {
    let vocab = model.config.vocab_size;
    match test {
        BenchTest::Prefill { n } => {
            let toks = random_tokens(n, vocab, 1);
            let mut kv = model.new_kv(n);
            model.prepare_kv(&mut kv)?;
            let t = Instant::now();
            prefill(model, state, &mut kv, &toks, Logits::Last)?;
            Ok(t.elapsed().as_secs_f64())
        }
        BenchTest::Decode { n, depth } => {
            let toks = random_tokens(n + depth, vocab, 2);
            let mut kv = model.new_kv(n + depth);
            model.prepare_kv(&mut kv)?;
            prefill(model, state, &mut kv, &toks[..depth], Logits::None)?;
            let t = Instant::now();
            for tok in &toks[depth..] {
                model.forward(state, &mut [SeqBatch { kv: &mut kv, tokens: std::slice::from_ref(tok), logits: Logits::Last }])?;
            }
            Ok(t.elapsed().as_secs_f64())
        }
    }
}

/// Runs each test `reps` times after its warm-up ([`warm_up`]: until two consecutive untimed
/// runs agree); `progress` sees each finished row (with its number of warm-up runs).
pub fn bench(
    model: &Model,
    tests: &[BenchTest],
    reps: usize,
    mut progress: impl FnMut(&BenchResult),
) -> Result<Vec<BenchResult>, ModelError> {
    let mut state = model.new_state(512);
    let mut out = Vec::new();
    for &test in tests {
        let warmup = warm_up(model, &mut state, test)?;
        let speeds: Vec<f64> =
            (0..reps.max(1)).map(|_| run_once(model, &mut state, test).map(|s| test.tokens() as f64 / s)).collect::<Result<_, _>>()?;
        let mean = speeds.iter().sum::<f64>() / speeds.len() as f64;
        let var = speeds.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / speeds.len() as f64;
        let r = BenchResult { test: test.name(), tokens_per_s: mean, stddev: var.sqrt(), reps: speeds.len(), warmup };
        progress(&r);
        out.push(r);
    }
    Ok(out)
}

/// Bytes one decode step reads at `context` tokens of context: every weight tensor once (the
/// token embedding only as the output projection when tied, else one row of it) plus the f16 K
/// and V rows each layer attends to (a sliding window caps them). The decode floor is these
/// bytes over the measured read bandwidth.
pub fn decode_bytes(model: &Model, context: usize) -> DecodeBytes {
    let c = &model.config;
    let mut weights = 0u64;
    for t in &model.gguf.tensors {
        weights += if t.name == "token_embd.weight" && !c.tied_output { t.n_bytes / c.vocab_size.max(1) as u64 } else { t.n_bytes };
    }
    let kv: u64 = (0..c.n_layer)
        .map(|l| {
            let keys = match c.sliding_window {
                Some(w) if c.swa_layers.get(l).copied().unwrap_or(false) => context.min(w),
                _ => context,
            };
            (2 * keys * c.n_head_kv * c.head_dim * 2) as u64
        })
        .sum();
    DecodeBytes { weights, kv }
}

/// What one decode step reads ([`decode_bytes`]).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DecodeBytes {
    /// Weight bytes (quantized, as stored).
    pub weights: u64,
    /// f16 K and V bytes over all layers.
    pub kv: u64,
}

impl DecodeBytes {
    pub fn total(&self) -> u64 {
        self.weights + self.kv
    }
}

/// A raw prompt of exactly `tokens` tokens (when the tokenizer allows; at least close): numbered
/// delivery records that read like a ledger, varied by `seed`. For scheduling measurements and
/// tests that need long prompts of a known length.
pub fn ledger_text(tok: &super::tokenizer::Tokenizer, tokens: usize, seed: u64) -> Result<String, super::tokenizer::TokenizerError> {
    const NAMES: [&str; 8] = ["Ada", "Bruno", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana"];
    const CITIES: [&str; 8] = ["Lyon", "Porto", "Oslo", "Quito", "Accra", "Hanoi", "Perth", "Riga"];
    let mut rng = Rng::new(seed);
    let mut pick = |n: u64| (rng.next_u64() % n) as usize;
    let count = |text: &str| tok.encode_prompt(text).map(|ids| ids.len());
    let mut lines = vec!["Ledger of deliveries.\n".to_string()];
    let mut text = lines[0].clone();
    while count(&text)? < tokens {
        for _ in 0..16 {
            let i = lines.len();
            let line =
                format!("Record {i}: {} moved {} boxes from {} to {} on day {}.\n", NAMES[pick(8)], pick(90) + 10, CITIES[pick(8)], CITIES[pick(8)], pick(28) + 1);
            text.push_str(&line);
            lines.push(line);
        }
    }
    while lines.len() > 1 && count(&text)? > tokens {
        let last = lines.pop().unwrap_or_default();
        text.truncate(text.len() - last.len());
    }
    // Single-token words up to the length.
    while count(&text)? < tokens {
        text.push_str(" ok");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::BenchTest;

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for t in BenchTest::defaults().into_iter().chain([BenchTest::Decode { n: 64, depth: 2048 }, BenchTest::Prefill { n: 4096 }]) {
            assert_eq!(BenchTest::parse(&t.name()), Some(t), "{}", t.name());
        }
        assert_eq!(BenchTest::parse("tg128@d0"), Some(BenchTest::Decode { n: 128, depth: 0 }));
        for bad in ["", "pp", "pp0", "tg", "tgx", "tg128@", "tg128@d", "tg128@dx", "pp-1", "xx128"] {
            assert_eq!(BenchTest::parse(bad), None, "{bad}");
        }
        assert_eq!(BenchTest::Decode { n: 128, depth: 4096 }.mean_context(), Some(4160));
        assert_eq!(BenchTest::Prefill { n: 4 }.mean_context(), None);
    }
}
