//! `forge-cache serve`: the gRPC service on one model and one database, until Ctrl-C or SIGTERM.

use forge_cache::cache::semantic::SemanticConfig;
use forge_cache::cache::trust::TrustParams;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use forge_cache::engine::scheduler::SchedulerConfig;
use forge_cache::server::{start_with_shutdown, ServerConfig};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from scripts/fetch-models.sh).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// SQLite database: request log, exact cache, facts (created when missing).
    #[arg(long, default_value = super::DEFAULT_DB)]
    pub db: PathBuf,
    /// Address to listen on (port 0 = any free port).
    #[arg(long, default_value = super::DEFAULT_ADDR)]
    pub addr: String,
    /// CPU threads for the model (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Serve every request as cache_mode BYPASS: no cache reads or writes (requests are still logged).
    #[arg(long)]
    pub no_cache: bool,
    /// TOML file of tenants and their API keys; without it the x-forge-tenant header names the tenant.
    #[arg(long)]
    pub tenants: Option<PathBuf>,
    /// Requests that may wait for the engine; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = SchedulerConfig::default().queue_depth)]
    pub queue_depth: usize,
    /// Sequences batched into each forward pass.
    #[arg(long, default_value_t = SchedulerConfig::default().max_active)]
    pub max_batch: usize,
    /// Sentence embedder folder for the semantic tier (default: the fetched all-MiniLM-L6-v2).
    #[arg(long)]
    pub embedder: Option<PathBuf>,
    /// Turn the semantic tier off (exact cache and facts only).
    #[arg(long)]
    pub no_semantic: bool,
    /// TRUST: bound on the rate of served answers that differ from the model's.
    #[arg(long, default_value_t = TrustParams::default().delta)]
    pub trust_delta: f64,
    /// TRUST: confidence of that bound, as a one-sided normal quantile (1.645 = 95%).
    #[arg(long, default_value_t = TrustParams::default().z)]
    pub trust_z: f64,
    /// Neighbours less similar than this (cosine) are not used as drafts.
    #[arg(long, default_value_t = SemanticConfig::default().min_similarity)]
    pub min_similarity: f64,
    #[command(flatten)]
    pub backend: super::BackendArgs,
}

/// Ctrl-C, or SIGTERM where there is one.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    let mut config = ServerConfig::new(a.model.clone().unwrap_or_else(forge_cache::models::default_llm), &a.db);
    config.threads = a.threads;
    config.cache = !a.no_cache;
    if !(a.trust_delta > 0.0 && a.trust_delta < 1.0) || !(a.trust_z > 0.0 && a.trust_z.is_finite()) {
        anyhow::bail!("--trust-delta must be in (0, 1) and --trust-z positive");
    }
    if !(-1.0..=1.0).contains(&a.min_similarity) {
        anyhow::bail!("--min-similarity must be in [-1, 1]");
    }
    config.embedder = if a.no_semantic { None } else { Some(a.embedder.clone().unwrap_or_else(forge_cache::models::default_embedder)) };
    config.semantic = SemanticConfig {
        min_similarity: a.min_similarity,
        trust: TrustParams { delta: a.trust_delta, z: a.trust_z },
        ..SemanticConfig::default()
    };
    config.tenants = a.tenants.clone();
    config.placement = a.backend.options()?;
    config.scheduler = SchedulerConfig { queue_depth: a.queue_depth, max_active: a.max_batch, ..SchedulerConfig::default() };
    super::runtime()?.block_on(async {
        let server = start_with_shutdown(config, &a.addr, shutdown_signal()).await.context("starting the service")?;
        eprintln!(
            "forge-cache: serving {} (sha256 {}) on {} | database {} | cache {} | tenants {}",
            server.model_name,
            &server.model_id[..12],
            server.url(),
            a.db.display(),
            if a.no_cache { "off" } else { "on" },
            a.tenants.as_ref().map_or("by x-forge-tenant header".to_string(), |p| format!("by API key ({})", p.display())),
        );
        server.wait().await.context("serving")?;
        eprintln!("forge-cache: stopped");
        Ok(())
    })
}
