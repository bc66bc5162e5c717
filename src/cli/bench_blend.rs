//! `forge-cache bench-blend`: cache mode BLEND on SQuAD v1.1 dev. Each prompt holds three
//! paragraphs of one article as documents, in a shuffled order, and a question about one of
//! them at the end; each article's documents are seen once first (their chunks' KV stored), then
//! every measured prompt runs as a full prefill (BYPASS) and as BLEND at each recompute ratio,
//! greedy. Reported per ratio: exact agreement of the answer with the full prefill's, answer F1
//! against the gold answers (SQuAD's normalisation), time to first token as the service
//! measures it (received to first token) against the full prefill's. Runs the pipeline in this
//! process (no network), with the machine's load printed beside the numbers.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;
use tokio_stream::StreamExt;

use forge_cache::pipeline::{Pipeline, PipelineConfig, Request};
use forge_cache::vocab::{CacheMode, ServedFrom};
use forge_cache::workload::KvConfig;

#[derive(Debug, Args)]
pub struct BenchBlendArgs {
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads for the model (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Folder with squad_v1.1_dev_contexts.jsonl and squad_v1.1_dev_questions.jsonl.
    #[arg(long, default_value = "../shared/data/squad")]
    pub squad: PathBuf,
    /// Articles; each gives `--questions` prompts over the same three documents.
    #[arg(long, default_value_t = 8)]
    pub articles: usize,
    /// Articles skipped first (in the file's order): measure on articles not used to choose a setting.
    #[arg(long, default_value_t = 0)]
    pub skip_articles: usize,
    /// Prompts (questions, each with its own order of the documents) per article.
    #[arg(long, default_value_t = 3)]
    pub questions: usize,
    /// Recompute ratios to measure, in percent.
    #[arg(long, value_delimiter = ',', default_value = "0,15,30")]
    pub ratios: Vec<f32>,
    /// Tokens generated per answer.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Print one JSON object per prompt and ratio as well.
    #[arg(long)]
    pub json: bool,
}

const SYSTEM: &str = "Reply with only the short answer phrase, copied from the documents. No sentence.";

struct Prompt {
    docs: Vec<String>,
    question: String,
    gold: Vec<String>,
}

fn read_jsonl(path: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// Per article: its first three paragraphs (documents, the warm-up order) and prompts, each a
/// question about one of them with the documents in an order of its own.
fn prompts(a: &BenchBlendArgs) -> anyhow::Result<Vec<(Vec<String>, Vec<Prompt>)>> {
    let contexts = read_jsonl(&a.squad.join("squad_v1.1_dev_contexts.jsonl"))?;
    let questions = read_jsonl(&a.squad.join("squad_v1.1_dev_questions.jsonl"))?;
    let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut out = Vec::new();
    let mut titles: Vec<String> = Vec::new();
    let mut eligible = 0;
    for c in &contexts {
        let t = s(c, "title");
        if !titles.contains(&t) {
            titles.push(t);
        }
    }
    // The 6 orders of three documents; prompt i of article j takes order (i + j) % 6.
    const ORDERS: [[usize; 3]; 6] = [[0, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0], [0, 2, 1], [1, 0, 2]];
    for (j, title) in titles.iter().enumerate() {
        let paras: Vec<&serde_json::Value> = contexts.iter().filter(|c| &s(c, "title") == title).take(3).collect();
        if paras.len() < 3 || paras.iter().any(|p| s(p, "context").len() > 1500) {
            continue; // keep prompts near 500 tokens
        }
        eligible += 1;
        if eligible <= a.skip_articles {
            continue;
        }
        let docs: Vec<String> = paras.iter().map(|p| s(p, "context")).collect();
        let mut mine = Vec::new();
        for i in 0..a.questions {
            let p = paras[i % 3];
            let id = s(p, "context_id");
            let Some(q) = questions.iter().filter(|q| s(q, "context_id") == id).nth(i / 3) else { continue };
            let gold = q["answers"].as_array().map(|v| v.iter().filter_map(|x| x.as_str().map(str::to_string)).collect()).unwrap_or_default();
            let order = ORDERS[(i + j) % ORDERS.len()];
            mine.push(Prompt { docs: order.iter().map(|&k| docs[k].clone()).collect(), question: s(q, "question"), gold });
        }
        if mine.len() == a.questions {
            out.push((docs, mine));
        }
        if out.len() == a.articles {
            break;
        }
    }
    if out.len() < a.articles {
        bail!("only {} articles have three paragraphs of at most 1500 bytes and {} questions", out.len(), a.questions);
    }
    Ok(out)
}

/// SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.
fn normalize(s: &str) -> Vec<String> {
    let lower: String = s.to_lowercase().chars().filter(|c| !c.is_ascii_punctuation()).collect();
    lower.split_whitespace().filter(|w| !matches!(*w, "a" | "an" | "the")).map(str::to_string).collect()
}

/// SQuAD's token F1 of `answer` against the best of `gold`, in percent.
pub fn f1(answer: &str, gold: &[String]) -> f64 {
    let a = normalize(answer);
    gold.iter()
        .map(|g| {
            let g = normalize(g);
            let mut left = g.clone();
            let common = a.iter().filter(|w| left.iter().position(|x| x == *w).map(|i| left.swap_remove(i)).is_some()).count();
            if common == 0 {
                return 0.0;
            }
            let (p, r) = (common as f64 / a.len() as f64, common as f64 / g.len() as f64);
            200.0 * p * r / (p + r)
        })
        .fold(0.0, f64::max)
}

/// The answer's first line (the model may go on after it).
fn first_line(text: &str) -> &str {
    text.trim().lines().next().unwrap_or_default()
}

struct Answer {
    text: String,
    ttft_ms: f64,
    recomputed: usize,
    reused: usize,
}

async fn ask(p: &Arc<Pipeline>, docs: &[String], question: &str, mode: CacheMode, ratio: Option<f32>, max_tokens: u32) -> anyhow::Result<Answer> {
    let req = Request {
        prompt: question.to_string(),
        system: SYSTEM.into(),
        max_tokens: Some(max_tokens),
        cache_mode: mode,
        documents: docs.to_vec(),
        blend_recompute: ratio,
        ..Request::default()
    };
    let mut g = p.generate("bench".into(), req).await?;
    let mut text = String::new();
    while let Some(piece) = g.chunks.next().await {
        let piece = piece?;
        text.push_str(&piece.text);
        if let Some(o) = piece.outcome {
            let want = if mode == CacheMode::Blend { ServedFrom::Blend } else { ServedFrom::Model };
            if o.served_from != want {
                bail!("served from {} (expected {want})", o.served_from);
            }
            return Ok(Answer { text, ttft_ms: o.ttft_ms.unwrap_or(o.latency_ms), recomputed: o.blend_tokens_recomputed, reused: o.blend_tokens_reused });
        }
    }
    bail!("the answer ended without an outcome")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_else(|_| "unknown".into())
}

/// The mean of `blend - full` per prompt and its paired bootstrap 95% interval (2,000
/// resamples of the prompts, a fixed generator: the same data give the same interval).
pub fn paired_delta(full: &[f64], blend: &[f64]) -> (f64, f64, f64) {
    let d: Vec<f64> = full.iter().zip(blend).map(|(f, b)| b - f).collect();
    let n = d.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut means: Vec<f64> = (0..2000)
        .map(|_| {
            let mut sum = 0.0;
            for _ in 0..n {
                // xorshift64*
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                sum += d[(x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n];
            }
            sum / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    (mean, means[50], means[1949])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(a: &BenchBlendArgs) -> anyhow::Result<()> {
    let model = forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?;
    if !model.exists() {
        bail!(forge_cache::models::missing_hint(&model));
    }
    if a.ratios.iter().any(|r| !(0.0..=100.0).contains(r)) {
        bail!("--ratios are percentages from 0 to 100");
    }
    let sets = prompts(a)?;
    let dir = std::env::temp_dir().join(format!("forge-bench-blend-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut config = PipelineConfig::new(&model, dir.join("bench.db"));
    config.threads = a.threads;
    config.embedder = None;
    config.kv = Some(KvConfig::default());
    let load_before = loadavg();
    let result = super::runtime()?.block_on(async {
        let p = Arc::new(tokio::task::block_in_place(|| Pipeline::load(&config))?);
        let _ = ask(&p, &[], "Hello.", CacheMode::Bypass, None, 2).await?;
        let n = a.ratios.len();
        // Per ratio: agreements, F1s, TTFTs; the full prefill's F1s and TTFTs.
        let (mut agree, mut f1s, mut ttfts) = (vec![0usize; n], vec![Vec::new(); n], vec![Vec::new(); n]);
        let (mut full_f1, mut full_ttft, mut speedups) = (Vec::new(), Vec::new(), vec![Vec::new(); n]);
        let mut recomputed = vec![0usize; n];
        let mut reused = vec![0usize; n];
        let mut count = 0;
        let total: usize = sets.iter().map(|s| s.1.len()).sum();
        let started = std::time::Instant::now();
        for (docs, set) in &sets {
            // The documents seen once: their chunks' KV is stored.
            ask(&p, docs, "What are these documents about?", CacheMode::Blend, Some(0.0), 4).await?;
            for q in set {
                let full = ask(&p, &q.docs, &q.question, CacheMode::Bypass, None, a.max_tokens).await?;
                let ff1 = f1(first_line(&full.text), &q.gold);
                full_f1.push(ff1);
                full_ttft.push(full.ttft_ms);
                for (i, r) in a.ratios.iter().enumerate() {
                    let b = ask(&p, &q.docs, &q.question, CacheMode::Blend, Some(r / 100.0), a.max_tokens).await?;
                    let bf1 = f1(first_line(&b.text), &q.gold);
                    agree[i] += usize::from(b.text == full.text);
                    f1s[i].push(bf1);
                    ttfts[i].push(b.ttft_ms);
                    speedups[i].push(full.ttft_ms / b.ttft_ms);
                    recomputed[i] += b.recomputed;
                    reused[i] += b.reused;
                    if a.json {
                        println!(
                            "{}",
                            serde_json::json!({"question": q.question, "ratio": r, "full": full.text, "blend": b.text,
                                "full_f1": ff1, "blend_f1": bf1, "full_ttft_ms": full.ttft_ms, "blend_ttft_ms": b.ttft_ms})
                        );
                    }
                }
                count += 1;
                let mean_now = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
                let deltas: Vec<String> = f1s.iter().map(|f| format!("{:+.1}", mean_now(f) - mean_now(&full_f1))).collect();
                eprint!(
                    "\r{count}/{total} prompts, {:.0} s, ΔF1 so far {} (load {})   ",
                    started.elapsed().as_secs_f64(),
                    deltas.join(" "),
                    loadavg()
                );
            }
        }
        eprintln!();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!("prompts: {count} (3 SQuAD v1.1 dev paragraphs each, shuffled orders, greedy, {} tokens)", a.max_tokens);
        println!("full prefill: F1 {:.1}, median TTFT {:.0} ms", mean(&full_f1), median(full_ttft.clone()));
        println!("ratio  agreement  F1     ΔF1 [paired bootstrap 95%]  median TTFT ms  full/blend TTFT: median (min..max of per-prompt ratios)  doc tokens recomputed/reused");
        for (i, r) in a.ratios.iter().enumerate() {
            let (d, lo, hi) = paired_delta(&full_f1, &f1s[i]);
            let s = &speedups[i];
            println!(
                "{:>4}%  {:>3}/{:<3}    {:>5.1}  {:>+5.1} [{:+.1}, {:+.1}]  {:>14.0}  {:>6.2}x ({:.2}..{:.2})  {}/{}",
                r,
                agree[i],
                count,
                mean(&f1s[i]),
                d,
                lo,
                hi,
                median(ttfts[i].clone()),
                median(s.clone()),
                s.iter().copied().fold(f64::INFINITY, f64::min),
                s.iter().copied().fold(0.0, f64::max),
                recomputed[i],
                reused[i]
            );
        }
        println!("ratio: fraction of the moved documents' tokens recomputed (the first document, an exact prefix, is kept as it is)");
        println!("elapsed {:.0} s", started.elapsed().as_secs_f64());
        anyhow::Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
    println!("load average before: {load_before}; after: {}", loadavg());
    result
}

#[cfg(test)]
mod tests {
    use super::{f1, paired_delta};

    #[test]
    fn paired_bootstrap_interval() {
        let full = vec![100.0, 0.0, 100.0, 0.0, 50.0, 100.0, 0.0, 0.0];
        assert_eq!(paired_delta(&full, &full), (0.0, 0.0, 0.0));
        let blend = vec![0.0, 0.0, 100.0, 0.0, 50.0, 100.0, 0.0, 0.0];
        let (d, lo, hi) = paired_delta(&full, &blend);
        assert_eq!(d, -12.5);
        assert!(lo < d && d <= hi && hi <= 0.0 && lo >= -100.0, "{lo} {d} {hi}");
    }

    #[test]
    fn squad_f1() {
        let g = vec!["Denver Broncos".to_string(), "the Broncos".to_string()];
        assert_eq!(f1("The Denver Broncos.", &g), 100.0);
        assert!((f1("Broncos won", &g) - 66.666).abs() < 0.01);
        assert_eq!(f1("Carolina", &g), 0.0);
    }
}
