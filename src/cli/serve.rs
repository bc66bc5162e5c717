//! `forge-cache serve`: the gRPC service and the OpenAI-compatible HTTP API on one model and one
//! database, in one process, until Ctrl-C or SIGTERM.

use forge_cache::cache::equivalent::EquivalentParams;
use forge_cache::cache::semantic::SemanticConfig;
use forge_cache::cache::skip::SkipParams;
use forge_cache::vocab::CacheMode;
use forge_cache::cache::trust::TrustParams;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use forge_cache::engine::scheduler::SchedulerConfig;
use forge_cache::server::{start_listening, Listen, ServerConfig, DEFAULT_HTTP_ADDR};
use forge_cache::workload::{Codec, KvConfig, Storage};

use super::EmbedWeights;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The knowledge store (request log, exact cache, facts, vectors): a SQLite file (created
    /// when missing), or `postgres://USER@HOST:PORT/DB` for one PostgreSQL + pgvector shared by
    /// several replicas (KV blocks then stay in each replica's memory).
    #[arg(long, default_value = super::DEFAULT_DB)]
    pub db: PathBuf,
    /// gRPC address to listen on (port 0 = any free port).
    #[arg(long, default_value = super::DEFAULT_ADDR)]
    pub addr: String,
    /// OpenAI-compatible HTTP API address (/v1/chat/completions, /v1/completions, /v1/models,
    /// /health, /metrics); it answers /health with 503 while the model loads.
    #[arg(long, default_value = DEFAULT_HTTP_ADDR)]
    pub http_addr: String,
    /// The largest gRPC request message accepted, in MiB; a longer one is refused with
    /// RESOURCE_EXHAUSTED before it is read.
    #[arg(long, default_value_t = (forge_cache::server::codec::DEFAULT_MAX_MESSAGE_BYTES >> 20) as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub max_message_mb: u64,
    /// No HTTP API (gRPC only).
    #[arg(long)]
    pub no_http: bool,
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
    /// How the embedder holds its matrices: f16 streams half the bytes per question (a semantic
    /// hit is mostly that embedding); f32 as stored.
    #[arg(long, value_enum, default_value_t = EmbedWeights::F16)]
    pub embed_weights: EmbedWeights,
    /// TRUST: bound on the rate of served answers that differ from the model's.
    #[arg(long, default_value_t = TrustParams::default().delta)]
    pub trust_delta: f64,
    /// TRUST: confidence of that bound, as a one-sided normal quantile (1.645 = 95%).
    #[arg(long, default_value_t = TrustParams::default().z)]
    pub trust_z: f64,
    /// Neighbours less similar than this (cosine) are not used as drafts.
    #[arg(long, default_value_t = SemanticConfig::default().min_similarity)]
    pub min_similarity: f64,
    /// A tenant's cache mode for requests that leave it unset (or say AUTO): TENANT=MODE,
    /// repeatable (e.g. `--tenant-cache-mode acme=equivalent`).
    #[arg(long = "tenant-cache-mode", value_parser = parse_tenant_mode)]
    pub tenant_cache_modes: Vec<(String, CacheMode)>,
    /// EQUIVALENT: bound on the rate of served candidates that are not acceptable.
    #[arg(long, default_value_t = EquivalentParams::default().delta)]
    pub equivalent_delta: f64,
    /// EQUIVALENT: a candidate is acceptable when its log-likelihood per token under the new
    /// prompt is at most this many nats below the fresh greedy answer's.
    #[arg(long, default_value_t = EquivalentParams::default().margin)]
    pub equivalent_margin: f64,
    /// EQUIVALENT: share of candidates inside the serving region decoded anyway (exploration).
    #[arg(long, default_value_t = EquivalentParams::default().explore)]
    pub equivalent_explore: f64,
    /// EQUIVALENT: nearest answers scored per request (one batch).
    #[arg(long, default_value_t = EquivalentParams::default().candidates)]
    pub equivalent_candidates: usize,
    /// EQUIVALENT: score only the first N tokens of a candidate (0: the whole answer). The
    /// learned region is of this prefix's score: change it only with a fresh store.
    #[arg(long, default_value_t = EquivalentParams::default().prefix)]
    pub equivalent_prefix: usize,
    /// VERIFIED: skip drafts in similarity bands whose acceptance is below this (0 = never
    /// skip), until the engine has measured what a draft row costs against a decode step (then
    /// that share is the floor, unless --draft-floor-fixed).
    #[arg(long, default_value_t = SkipParams::default().floor)]
    pub draft_floor: f64,
    /// VERIFIED: keep --draft-floor as the floor instead of the measured cost of a draft row.
    #[arg(long)]
    pub draft_floor_fixed: bool,
    /// VERIFIED: share of requests in a skipped band that still get drafts (only requests whose
    /// drafts cannot be replayed on their answer: sampled, or the neighbour's answer does not
    /// fit the budget).
    #[arg(long, default_value_t = SkipParams::default().explore)]
    pub draft_explore: f64,
    /// VERIFIED: where the draft gate skips drafts at every similarity, the share of greedy
    /// requests that still run the semantic lookup (embed, search, file the question, replay the
    /// skipped drafts so the gate keeps learning); the others skip the semantic tier altogether
    /// and are not filed as neighbours. 1 = every request looks up.
    #[arg(long, default_value_t = SkipParams::default().lookup_explore)]
    pub lookup_explore: f64,
    #[command(flatten)]
    pub backend: super::BackendArgs,
    /// Memory for reusable KV blocks, in MiB (least recently used evicted first).
    #[arg(long, default_value_t = KvConfig::default().memory_bytes >> 20)]
    pub kv_memory_mb: u64,
    /// Disk for reusable KV blocks, in MiB (never exceeded; 0 = keep none across restarts).
    #[arg(long, default_value_t = KvConfig::default().disk_bytes >> 20)]
    pub kv_disk_mb: u64,
    /// Tokens per KV block: prompts share work in whole blocks.
    #[arg(long, default_value_t = KvConfig::default().block_tokens as u64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub kv_block_tokens: u64,
    /// How KV blocks are stored on disk: f16 (lossless: answers identical after a restart),
    /// q8_0 or q4_0 (smaller, lossy).
    #[arg(long, default_value = "f16", value_parser = ["f16", "q8_0", "q4_0"])]
    pub kv_codec: String,
    /// Where stored KV bytes live: file (a memory-mapped side file DB.kv) or blob (in the database).
    /// With --db postgres://...: blob = bytea rows every replica loads (shared, --kv-disk-mb
    /// bounds the table), file = none (each replica keeps its blocks in memory).
    #[arg(long, default_value = "file", value_parser = ["file", "blob"])]
    pub kv_storage: String,
    /// BLEND (cache mode, opt-in, lossy): percent of document tokens recomputed in every layer
    /// (the rest reuse the documents' KV computed elsewhere; 100 = the full prefill's KV).
    #[arg(long, default_value_t = KvConfig::default().blend_recompute as f64 * 100.0, value_parser = percent)]
    pub blend_recompute: f64,
    /// Turn KV-block reuse off.
    #[arg(long)]
    pub no_kv_reuse: bool,
    /// How an existing database is checked at start: auto (integrity_check up to 64 MiB,
    /// quick_check above), quick, full, or off (huge stores); a damaged one is refused untouched.
    #[arg(long, default_value = "auto", value_parser = ["auto", "quick", "full", "off"])]
    pub db_check: String,
}

impl ServeArgs {
    /// The KV-reuse configuration these flags ask for.
    pub fn kv_config(&self) -> anyhow::Result<Option<KvConfig>> {
        if self.no_kv_reuse {
            return Ok(None);
        }
        Ok(Some(KvConfig {
            memory_bytes: self.kv_memory_mb << 20,
            disk_bytes: self.kv_disk_mb << 20,
            block_tokens: self.kv_block_tokens as usize,
            codec: Codec::parse(&self.kv_codec)?,
            storage: if self.kv_storage == "blob" { Storage::Blob } else { Storage::File },
            blend_recompute: (self.blend_recompute / 100.0) as f32,
        }))
    }
}

/// A percentage 0 ..= 100.
fn percent(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('%').parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100")),
    }
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

/// `acme=equivalent` → (tenant, mode).
fn parse_tenant_mode(s: &str) -> Result<(String, CacheMode), String> {
    let (t, m) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected TENANT=MODE"))?;
    if !forge_cache::pipeline::tenants::valid_tenant_name(t) {
        return Err(format!("{t:?} is not a valid tenant name"));
    }
    let mode = CacheMode::parse(m).ok_or_else(|| format!("unknown cache mode {m:?}: auto, bypass, refresh, verified, trust, exact, equivalent, blend"))?;
    Ok((t.to_string(), mode))
}

pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    let mut config = ServerConfig::new(forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?, &a.db);
    config.threads = a.threads;
    config.cache = !a.no_cache;
    if !(a.trust_delta > 0.0 && a.trust_delta < 1.0) || !(a.trust_z > 0.0 && a.trust_z.is_finite()) {
        anyhow::bail!("--trust-delta must be in (0, 1) and --trust-z positive");
    }
    if !(-1.0..=1.0).contains(&a.min_similarity) {
        anyhow::bail!("--min-similarity must be in [-1, 1]");
    }
    config.embed_weights = a.embed_weights.into();
    config.embedder = if a.no_semantic { None } else { Some(a.embedder.clone().unwrap_or_else(forge_cache::models::default_embedder)) };
    if !(a.equivalent_delta > 0.0 && a.equivalent_delta < 1.0) || !(0.0..=1.0).contains(&a.equivalent_explore) || !(a.equivalent_margin >= 0.0) {
        anyhow::bail!("--equivalent-delta must be in (0, 1), --equivalent-explore in [0, 1], --equivalent-margin >= 0");
    }
    if !(0.0..=1.0).contains(&a.draft_floor) || !(0.0..=1.0).contains(&a.draft_explore) || !(0.0..=1.0).contains(&a.lookup_explore) || a.equivalent_candidates == 0 {
        anyhow::bail!("--draft-floor, --draft-explore and --lookup-explore must be in [0, 1], --equivalent-candidates >= 1");
    }
    config.semantic = SemanticConfig {
        min_similarity: a.min_similarity,
        trust: TrustParams { delta: a.trust_delta, z: a.trust_z },
        equivalent: EquivalentParams {
            delta: a.equivalent_delta,
            z: a.trust_z,
            margin: a.equivalent_margin,
            explore: a.equivalent_explore,
            candidates: a.equivalent_candidates,
            prefix: a.equivalent_prefix,
        },
        skip: SkipParams {
            floor: a.draft_floor,
            learn_floor: !a.draft_floor_fixed,
            explore: a.draft_explore,
            lookup_explore: a.lookup_explore,
            enabled: a.draft_floor > 0.0,
            ..SkipParams::default()
        },
        ..SemanticConfig::default()
    };
    config.tenant_modes = a.tenant_cache_modes.iter().cloned().collect();
    config.tenants = a.tenants.clone();
    config.placement = a.backend.options()?;
    config.kv = a.kv_config()?;
    config.db_check = forge_cache::store::DbCheck::parse(&a.db_check).unwrap_or_default();
    config.scheduler = SchedulerConfig { queue_depth: a.queue_depth, max_active: a.max_batch, ..SchedulerConfig::default() };
    let config_kv = config.kv.clone();
    let listen = Listen {
        grpc: a.addr.clone(),
        http: (!a.no_http).then(|| a.http_addr.clone()),
        max_message_bytes: (a.max_message_mb << 20) as usize,
    };
    super::runtime()?.block_on(async {
        let server = start_listening(config, listen, shutdown_signal()).await.context("starting the service")?;
        let phases: Vec<String> = server.startup.iter().map(|(what, t)| format!("{what} {:.1} ms", t.as_secs_f64() * 1e3)).collect();
        tracing::info!(since_launch_ms = format!("{:.1}", super::since_launch().as_secs_f64() * 1e3), phases = %phases.join(", "), "start-up");
        tracing::info!(
            model = %server.model_name,
            sha256 = &server.model_id[..12],
            grpc = %server.url(),
            http = %server.http_url().unwrap_or_else(|| "off".into()),
            database = %forge_cache::store::pg::redact(&a.db.to_string_lossy()),
            cache = if a.no_cache { "off" } else { "on" },
            kv_reuse = %match &config_kv {
                Some(k) => format!("{} MiB memory, {} MiB disk, {}-token blocks, {}", k.memory_bytes >> 20, k.disk_bytes >> 20, k.block_tokens, k.codec),
                None => "off".into(),
            },
            tenants = %a.tenants.as_ref().map_or("by x-forge-tenant header".to_string(), |p| format!("by API key ({})", p.display())),
            "serving"
        );
        server.wait().await.context("serving")?;
        tracing::info!("stopped");
        Ok(())
    })
}
