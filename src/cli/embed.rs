//! `forge-cache embed TEXT...`: sentence embeddings with all-MiniLM-L6-v2. `--json` prints one
//! line per text: `{text, token_ids, embedding}`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::embed::Embedder;

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
    let embedder = Embedder::load(&dir, Arc::new(CpuBackend::new(a.threads)?)).with_context(|| format!("loading {}", dir.display()))?;
    let texts: Vec<&str> = a.texts.iter().map(String::as_str).collect();
    let embs = embedder.embed_batch(&texts)?;
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
