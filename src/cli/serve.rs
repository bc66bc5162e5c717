//! `forge-cache serve`: the gRPC service on one model and one database, until Ctrl-C or SIGTERM.

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
