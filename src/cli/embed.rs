//! `forge-cache embed TEXT...`: sentence embeddings with all-MiniLM-L6-v2. `--json` prints one
//! line per text: `{text, token_ids, embedding}`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::embed::Embedder;

use super::EmbedWeights;

#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// Texts to embed (each one separately; an empty string is allowed).
    #[arg(required = true)]
    pub texts: Vec<String>,
    /// One JSON object per line: text, token_ids, embedding.
    #[arg(long)]
    pub json: bool,
    /// Folder with model.safetensors, tokenizer.json and config.json (default: all-MiniLM-L6-v2).
    #[arg(long)]
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// How the matrices are held: f32 as stored, or f16 as `serve` holds them by default.
    #[arg(long, value_enum, default_value_t = EmbedWeights::F32)]
    pub weights: EmbedWeights,
    /// Embed each text alone (as the service embeds a question) and print the wall time per
    /// text (p50, p95, mean, after one warm-up text) to stderr; `--repeat N` passes over the texts.
    #[arg(long)]
    pub time: bool,
    #[arg(long, default_value_t = 1, requires = "time")]
    pub repeat: usize,
}

#[derive(serde::Serialize)]
struct JsonLine<'a> {
    text: &'a str,
    token_ids: &'a [u32],
    embedding: &'a [f32],
}

pub fn run(a: &EmbedArgs) -> anyhow::Result<()> {
    let dir = a.model.clone().unwrap_or_else(forge_cache::models::default_embedder);
    if !dir.join("model.safetensors").exists() {
        bail!(forge_cache::models::missing_hint(&dir.join("model.safetensors")));
    }
    let embedder = Embedder::load_with(&dir, Arc::new(CpuBackend::new(a.threads)?), a.weights.into()).with_context(|| format!("loading {}", dir.display()))?;
    let texts: Vec<&str> = a.texts.iter().map(String::as_str).collect();
    let embs = if a.time { time_each(&embedder, &texts, a.repeat.max(1))? } else { embedder.embed_batch(&texts)? };
    let mut out = std::io::stdout().lock();
    for (text, e) in texts.iter().zip(&embs) {
        if a.json {
            let line = JsonLine { text, token_ids: &e.token_ids, embedding: &e.vector };
            writeln!(out, "{}", serde_json::to_string(&line)?)?;
        } else {
            let head: Vec<String> = e.vector.iter().take(6).map(|v| format!("{v:+.4}")).collect();
            writeln!(out, "{text:?}: {} tokens, dim {} [{} ...]", e.token_ids.len(), e.vector.len(), head.join(", "))?;
        }
    }
    Ok(())
}

/// Embeds every text alone, `repeat` times over, and prints the per-text wall times to stderr.
fn time_each(embedder: &Embedder, texts: &[&str], repeat: usize) -> anyhow::Result<Vec<forge_cache::embed::Embedding>> {
    if let Some(t) = texts.first() {
        embedder.embed(t)?; // warm-up: page in the weights
    }
    let mut ms = Vec::with_capacity(texts.len() * repeat);
    let mut out = Vec::with_capacity(texts.len());
    let mut tokens = 0usize;
    for pass in 0..repeat {
        for t in texts {
            let start = std::time::Instant::now();
            let e = embedder.embed(t)?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
            tokens += e.token_ids.len();
            if pass == 0 {
                out.push(e);
            }
        }
    }
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    if !sorted.is_empty() {
        eprintln!(
            "embedded {} texts alone ({} tokens on average): p50 {:.2} ms, p95 {:.2} ms, mean {:.2} ms per text",
            ms.len(),
            tokens / ms.len(),
            pct(0.5),
            pct(0.95),
            ms.iter().sum::<f64>() / ms.len() as f64
        );
    }
    Ok(out)
}
