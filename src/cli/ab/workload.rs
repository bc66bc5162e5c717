//! Workload files for `forge-cache ab`: one JSON object per line,
//! `{"prompt", "tenant"?, "max_tokens"?, "system"?}` plus free-form fields the runner keeps in
//! the report (`pair`, `duplicate`, `source`). `--make-workload` builds them from
//! `../shared/data`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use forge_cache::engine::sampler::Rng;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Line {
    /// The request's prompt text.
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// QQP: the pair this question belongs to, and whether the pair is a paraphrase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pair: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
    /// Where the question came from (e.g. `squad`, `gsm8k`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Reads a workload, naming the line of any error; empty lines are skipped.
pub fn read(path: &Path) -> anyhow::Result<Vec<Line>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening workload {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).with_context(|| format!("{}:{}: not a workload line", path.display(), i + 1))?;
        if l.prompt.trim().is_empty() {
            bail!("{}:{}: empty prompt", path.display(), i + 1);
        }
        if l.max_tokens == Some(0) {
            bail!("{}:{}: max_tokens must be at least 1", path.display(), i + 1);
        }
        out.push(l);
    }
    if out.is_empty() {
        bail!("{}: the workload is empty", path.display());
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// QQP pairs (duplicates and non-duplicates as they come): each pair's first question, then its second.
    Qqp,
    /// SQuAD and GSM8K questions repeated with Zipf-distributed popularity.
    Zipf,
}

pub struct MakeArgs<'a> {
    /// Which workload to make.
    pub kind: Kind,
    /// Directory holding the datasets (`qqp/`, `squad/`, `gsm8k/`).
    pub data: &'a Path,
    /// Lines to write.
    pub requests: usize,
    /// Index of the first QQP pair, or of the first zipf pool question.
    pub offset: usize,
    /// `max_tokens` written on every line.
    pub max_tokens: u32,
    /// Seed of the workload's random choices.
    pub seed: u64,
    /// zipf: questions in the popularity pool.
    pub distinct: usize,
    /// The JSONL file written.
    pub out: &'a Path,
}

fn jsonl(path: PathBuf) -> anyhow::Result<Vec<serde_json::Value>> {
    let f = std::fs::File::open(&path).with_context(|| format!("opening {} (is --data the shared data folder?)", path.display()))?;
    std::io::BufReader::new(f)
        .lines()
        .map(|l| Ok(serde_json::from_str(&l?)?))
        .collect::<anyhow::Result<_>>()
        .with_context(|| format!("reading {}", path.display()))
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// Writes the workload; returns (lines, distinct prompts).
pub fn make(a: &MakeArgs<'_>) -> anyhow::Result<(usize, usize)> {
    let mut rng = Rng::new(a.seed);
    let lines: Vec<Line> = match a.kind {
        Kind::Qqp => {
            let mut pairs = jsonl(a.data.join("qqp/qqp_pairs.jsonl"))?;
            shuffle(&mut pairs, &mut rng);
            let n_pairs = a.requests.div_ceil(2);
            if a.offset + n_pairs > pairs.len() {
                bail!("only {} QQP pairs: --offset {} + {} pairs is too many", pairs.len(), a.offset, n_pairs);
            }
            pairs[a.offset..a.offset + n_pairs]
                .iter()
                .flat_map(|p| {
                    let id = p["id"].as_u64();
                    let dup = p["is_duplicate"].as_u64().map(|d| d == 1);
                    ["question1", "question2"].map(|k| Line {
                        prompt: p[k].as_str().unwrap_or_default().trim().to_string(),
                        tenant: None,
                        max_tokens: Some(a.max_tokens),
                        system: None,
                        pair: id,
                        duplicate: dup,
                        source: Some("qqp".into()),
                    })
                })
                .filter(|l| !l.prompt.is_empty())
                .take(a.requests)
                .collect()
        }
        Kind::Zipf => {
            let mut pool: Vec<(String, &str)> = jsonl(a.data.join("squad/squad_v1.1_dev_questions.jsonl"))?
                .iter()
                .filter_map(|q| q["question"].as_str().map(|s| (s.trim().to_string(), "squad")))
                .collect();
            pool.extend(
                jsonl(a.data.join("gsm8k/gsm8k_test.jsonl"))?.iter().filter_map(|q| q["question"].as_str().map(|s| (s.trim().to_string(), "gsm8k"))),
            );
            shuffle(&mut pool, &mut rng);
            // Popularity rank r has weight 1 / r^1.1 over a pool of `distinct` questions.
            let pool = &pool[a.offset.min(pool.len())..(a.offset + a.distinct.max(1)).min(pool.len())];
            if pool.is_empty() {
                bail!("--offset {} leaves no questions", a.offset);
            }
            let weights: Vec<f64> = (1..=pool.len()).map(|r| 1.0 / (r as f64).powf(1.1)).collect();
            let total: f64 = weights.iter().sum();
            (0..a.requests)
                .map(|_| {
                    let mut x = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
                    let mut i = 0;
                    while i + 1 < weights.len() && x >= weights[i] {
                        x -= weights[i];
                        i += 1;
                    }
                    Line {
                        prompt: pool[i].0.clone(),
                        tenant: None,
                        max_tokens: Some(a.max_tokens),
                        system: None,
                        pair: None,
                        duplicate: None,
                        source: Some(pool[i].1.into()),
                    }
                })
                .collect()
        }
    };
    let mut distinct: Vec<&str> = lines.iter().map(|l| l.prompt.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let mut f = std::io::BufWriter::new(std::fs::File::create(a.out).with_context(|| format!("creating {}", a.out.display()))?);
    for l in &lines {
        writeln!(f, "{}", serde_json::to_string(l)?)?;
    }
    f.flush()?;
    Ok((lines.len(), distinct.len()))
}
