//! `bench-check`: what an EQUIVALENT check costs against a plain prefill of the same tokens,
//! through the engine's scheduler as the service runs them. For each QQP pair: the model answers
//! the first question (greedy, its answer A and stop token as the service stores a candidate),
//! then for the second question's prompt P' three jobs run in a rotating order, one after the
//! other on an idle engine:
//!
//! * `prefill`: a generation of one token from P' + A (all but A's last token: the very rows a
//!   check feeds), no stored KV — what prefilling the prompt plus the answer costs;
//! * `check`: the scoring job of A under P' (log-probabilities of every answer token: the
//!   output head and a log-softmax on every answer row), no stored KV;
//! * `check+kv`: the same scoring job as the service submits it, loading P''s stored prefix
//!   from the KV-block tier's memory (the chat template's blocks, there since the first answer).
//!
//! A sixth arm, `answer`, is what BYPASS computes for P': its prefill and greedy decode of up to
//! `--max-tokens` tokens (no stored KV): answer ÷ check+kv bounds a served EQUIVALENT request's
//! speed-up at the engine (without the lookup, the embedding and the network).
//!
//! Per pair the ratios check ÷ prefill and check+kv ÷ prefill; min / median / max over pairs.
//! Two more arms call the model directly (no scheduler), one forward pass over the same rows:
//! `forward, last row` (a prefill's output head) and `forward, answer rows` (a check's), to show
//! what the output head over the answer rows costs by itself.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::chat::{ChatTemplate, Message};
use forge_cache::engine::generate::GenerateParams;
use forge_cache::engine::scheduler::{Event, Job, Scheduler, SchedulerConfig};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::{Logits, Model, SeqBatch};
use forge_cache::store::Store;
use forge_cache::vocab::StopReason;
use forge_cache::workload::{KvConfig, KvWorkload};

#[derive(Debug, Args)]
pub struct BenchCheckArgs {
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// QQP pairs (jsonl with question1, question2).
    #[arg(long, default_value = "../shared/data/qqp/qqp_pairs.jsonl")]
    pub qqp: PathBuf,
    /// Pairs to measure.
    #[arg(long, default_value_t = 30)]
    pub pairs: usize,
    /// Pairs skipped at the start of the file.
    #[arg(long, default_value_t = 1200)]
    pub offset: usize,
    /// Tokens of the first question's answer (the candidate).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Score only the first N answer tokens (as `serve --equivalent-prefix N`; 0: all); the
    /// prefill arms then feed the prompt plus those tokens.
    #[arg(long, default_value_t = 0)]
    pub prefix: usize,
    /// Print one JSON object per pair as well.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Deserialize)]
struct Pair {
    question1: String,
    question2: String,
}

#[derive(serde::Serialize)]
struct PairRow {
    prompt_tokens: usize,
    answer_tokens: usize,
    kv_reused: usize,
    prefill_ms: f64,
    check_ms: f64,
    check_kv_ms: f64,
    forward_last_ms: f64,
    forward_answer_ms: f64,
    answer_ms: f64,
}

/// A fresh folder under the system's temporary folder, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `job` alone and waits for its end: (milliseconds from submit to the end, the event).
fn run_job(sched: &Scheduler, job: Job, mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> anyhow::Result<(f64, Event)> {
    let t = Instant::now();
    sched.submit(job)?;
    loop {
        match rx.blocking_recv() {
            Some(Event::Token { .. }) => {}
            Some(Event::Failed(e)) => bail!("job failed: {e}"),
            Some(e) => return Ok((t.elapsed().as_secs_f64() * 1e3, e)),
            None => bail!("the engine stopped"),
        }
    }
}

fn generation(prompt: Vec<u32>, max_tokens: usize, stop_ids: &[u32]) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let params = GenerateParams { max_tokens, sampling: Default::default(), stop_ids: stop_ids.to_vec() };
    let job = Job { prompt, params, stop_strings: Vec::new(), events: tx, drafts: Vec::new(), kv: None, tenant: String::new(), logprobs: false, score: None, late: None };
    (job, rx)
}

/// One forward pass over `tokens` from an empty cache, logits from row `from` on; milliseconds.
fn forward(model: &Model, tokens: &[u32], from: usize) -> anyhow::Result<f64> {
    let mut state = model.new_state(tokens.len());
    let mut kv = model.new_kv(tokens.len());
    let t = Instant::now();
    model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens, logits: Logits::From(from) }])?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

pub fn run(a: &BenchCheckArgs) -> anyhow::Result<()> {
    if a.pairs == 0 || a.max_tokens < 2 {
        bail!("--pairs must be at least 1 and --max-tokens at least 2");
    }
    let path = forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?;
    if !path.exists() {
        bail!(forge_cache::models::missing_hint(&path));
    }
    let text = std::fs::read_to_string(&a.qqp).with_context(|| format!("reading {}", a.qqp.display()))?;
    let pairs: Vec<Pair> = text.lines().skip(a.offset).take(a.pairs).map(serde_json::from_str).collect::<Result<_, _>>()?;
    if pairs.len() < a.pairs {
        bail!("{}: only {} pairs after --offset {}", a.qqp.display(), pairs.len(), a.offset);
    }
    let model = Model::load(&path, Arc::new(CpuBackend::new(a.threads)?)).with_context(|| format!("loading {}", path.display()))?;
    let tok = Arc::new(Tokenizer::from_gguf(&model.gguf)?);
    let template = ChatTemplate::from_gguf(&model.gguf)?.context("the model has no chat template")?;
    let stop_ids = tok.stop_ids().to_vec();
    let model = Arc::new(model);
    let dir = Scratch(std::env::temp_dir().join(format!("forge-bench-check-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let store = Store::open(dir.0.join("bench.db"))?;
    let kv = KvWorkload::open(&KvConfig { disk_bytes: 0, ..KvConfig::default() }, &store, &model.config, "bench-check")?;
    let sched = Scheduler::start(model.clone(), tok.clone(), SchedulerConfig::default())?;
    let prompt_of = |q: &str| -> anyhow::Result<Vec<u32>> { Ok(tok.encode_prompt(&template.render(&[Message::user(q)], true)?)?) };

    let mut rows = Vec::new();
    for (i, p) in pairs.iter().enumerate() {
        // The candidate: the first question's greedy answer, computed with KV reuse as the
        // service computes it (so the chat template's blocks are in memory, as in the service).
        let p1 = prompt_of(&p.question1)?;
        let (mut job, rx) = generation(p1.clone(), a.max_tokens, &stop_ids);
        job.kv = Some(Box::new(kv.prepare("bench", &p1)));
        let (_, done) = run_job(&sched, job, rx)?;
        let Event::Done(f) = done else { bail!("the answer job did not end with its answer") };
        let mut answer = f.tokens;
        if f.stop == StopReason::Stop {
            answer.push(stop_ids[0]);
        }
        answer.truncate(forge_cache::cache::equivalent::scored_len(answer.len(), a.prefix));
        if answer.len() < 2 {
            continue;
        }
        let p2 = prompt_of(&p.question2)?;
        let fed: Vec<u32> = p2.iter().chain(&answer[..answer.len() - 1]).copied().collect();
        let (mut prefill, mut check, mut check_kv, mut reused) = (0.0, 0.0, 0.0, 0);
        let (mut forward_last, mut forward_answer, mut answer_ms) = (0.0, 0.0, 0.0);
        for arm in 0..6 {
            match (arm + i) % 6 {
                5 => {
                    let (job, rx) = generation(p2.clone(), a.max_tokens, &stop_ids);
                    answer_ms = run_job(&sched, job, rx)?.0;
                }
                3 => forward_last = forward(&model, &fed, fed.len() - 1)?,
                4 => forward_answer = forward(&model, &fed, p2.len() - 1)?,
                0 => {
                    let (job, rx) = generation(fed.clone(), 1, &stop_ids);
                    prefill = run_job(&sched, job, rx)?.0;
                }
                1 => {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let job = Job::score(p2.clone(), answer.clone(), stop_ids.clone(), String::new(), tx);
                    check = run_job(&sched, job, rx)?.0;
                }
                2 => {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    let mut job = Job::score(p2.clone(), answer.clone(), stop_ids.clone(), String::new(), tx);
                    job.kv = Some(Box::new(kv.prepare("bench", &p2)));
                    let (ms, e) = run_job(&sched, job, rx)?;
                    check_kv = ms;
                    if let Event::Scored(s) = e {
                        reused = s.kv_reused;
                    }
                }
                _ => unreachable!(),
            }
        }
        let row = PairRow { prompt_tokens: p2.len(), answer_tokens: answer.len(), kv_reused: reused, prefill_ms: prefill, check_ms: check, check_kv_ms: check_kv, forward_last_ms: forward_last, forward_answer_ms: forward_answer, answer_ms };
        if a.json {
            println!("{}", serde_json::to_string(&row)?);
        }
        rows.push(row);
    }
    if rows.is_empty() {
        bail!("no pair gave an answer of at least 2 tokens");
    }
    let n = rows.len() as f64;
    let mean = |f: &dyn Fn(&PairRow) -> f64| rows.iter().map(f).sum::<f64>() / n;
    let (lo, med, hi) = stats(rows.iter().map(|r| r.check_ms / r.prefill_ms).collect());
    let (klo, kmed, khi) = stats(rows.iter().map(|r| r.check_kv_ms / r.prefill_ms).collect());
    println!(
        "{} pairs: prompt {:.1} + answer {:.1} tokens (mean), {:.1} prompt tokens loaded by check+kv",
        rows.len(),
        mean(&|r| r.prompt_tokens as f64),
        mean(&|r| r.answer_tokens as f64),
        mean(&|r| r.kv_reused as f64)
    );
    println!("| arm | mean ms | ÷ prefill, per pair: min / median / max |");
    println!("|---|---|---|");
    println!("| prefill (prompt + answer, no stored KV) | {:.1} | 1 |", mean(&|r| r.prefill_ms));
    println!("| check (no stored KV) | {:.1} | {lo:.3} / **{med:.3}** / {hi:.3} |", mean(&|r| r.check_ms));
    println!("| check+kv (as served: stored prefix) | {:.1} | {klo:.3} / **{kmed:.3}** / {khi:.3} |", mean(&|r| r.check_kv_ms));
    let (flo, fmed, fhi) = stats(rows.iter().map(|r| r.forward_answer_ms / r.forward_last_ms).collect());
    println!("| forward pass alone, logits of the last row | {:.1} | |", mean(&|r| r.forward_last_ms));
    println!("| forward pass alone, logits of every answer row (÷ the line above) | {:.1} | {flo:.3} / **{fmed:.3}** / {fhi:.3} |", mean(&|r| r.forward_answer_ms));
    let (alo, amed, ahi) = stats(rows.iter().map(|r| r.answer_ms / r.check_kv_ms).collect());
    println!("| answer (BYPASS's work for P': prefill + decode ≤ {} tokens), ÷ check+kv | {:.1} | {alo:.2} / **{amed:.2}** / {ahi:.2} |", a.max_tokens, mean(&|r| r.answer_ms));
    Ok(())
}
