//! Speed measurements in llama-bench's terms, so the two print comparable tables:
//! `ppN` = prefill of N tokens from an empty cache (one batch, logits of the last token),
//! `tgN` = N one-token decode steps from an empty cache, `tgN@dD` = the same after D tokens of
//! context. Token ids are pseudo-random; every test runs once untimed, then `reps` times.

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

    /// The default set: pp128, pp512, tg128, tg128@d1024.
    pub fn defaults() -> Vec<BenchTest> {
        vec![
            BenchTest::Prefill { n: 128 },
            BenchTest::Prefill { n: 512 },
            BenchTest::Decode { n: 128, depth: 0 },
            BenchTest::Decode { n: 128, depth: 1024 },
        ]
    }

    fn tokens(&self) -> usize {
        match *self {
            BenchTest::Prefill { n } | BenchTest::Decode { n, .. } => n,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub test: String,
    /// Mean over the repetitions.
    pub tokens_per_s: f64,
    pub stddev: f64,
    pub reps: usize,
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

/// Runs each test `reps` times after one warm-up; `progress` sees each finished row.
pub fn bench(
    model: &Model,
    tests: &[BenchTest],
    reps: usize,
    mut progress: impl FnMut(&BenchResult),
) -> Result<Vec<BenchResult>, ModelError> {
    let mut state = model.new_state(512);
    let mut out = Vec::new();
    for &test in tests {
        run_once(model, &mut state, test)?;
        let speeds: Vec<f64> =
            (0..reps.max(1)).map(|_| run_once(model, &mut state, test).map(|s| test.tokens() as f64 / s)).collect::<Result<_, _>>()?;
        let mean = speeds.iter().sum::<f64>() / speeds.len() as f64;
        let var = speeds.iter().map(|s| (s - mean) * (s - mean)).sum::<f64>() / speeds.len() as f64;
        let r = BenchResult { test: test.name(), tokens_per_s: mean, stddev: var.sqrt(), reps: speeds.len() };
        progress(&r);
        out.push(r);
    }
    Ok(out)
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
