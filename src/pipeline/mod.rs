//! The one request pipeline every front end calls (gRPC in `server`, OpenAI-compatible HTTP in
//! `server::http`); the front ends only translate their messages into a [`Request`] and the
//! [`Chunk`]s back. A request goes through these stages, each in its own file:
//!
//! 1. `validation` — every field checked, the prompt rendered (chat template), the exact-cache
//!    key and semantic scope derived: a [`validation::Plan`] (text-generation-inference's
//!    `router/src/validation.rs` is the model); its second half tokenizes the prompt (and checks
//!    its length) only when an answer needs the tokens: an EXACT hit whose row kept its prompt's
//!    ids never waits for the tokenizer, which is built in the background at start-up;
//! 2. `tiers` — the caches, as calls into `cache/`: FACT and EXACT (found by the question and by
//!    the key, from the prompt's text), then the semantic tier (TRUST serves a neighbour's
//!    answer, else neighbours become drafts for the engine to verify);
//! 3. `run` — the engine job (KV plan, drafts) on the continuous-batching scheduler, its tokens
//!    streamed as they come; a client that goes away cancels the sequence;
//! 4. `record` — the one place an outcome is recorded: `inferences`, KV blocks, facts, the exact
//!    cache, the semantic index and TRUST's evidence, the metrics and the request's log line.
//!
//! Also here: `kv` (the KV a computed request reuses, passed between the stages), `deferred` (a
//! semantic lookup run after the first token), `tenants` (which tenant a call belongs to, from headers or API keys, for both
//! front ends), `metrics` (Prometheus counters, gauges and histograms) and the errors.
//!
//! Threads: the engine runs on its own thread ([`crate::engine::scheduler`]) with the CPU
//! backend's pool; SQLite calls and question embeddings run on tokio's blocking pool; new facts
//! are embedded on the fact indexer's low-priority thread while no request is in flight
//! ([`crate::cache::indexer`]); the async runtime itself needs only a couple of workers.

mod deferred;
pub mod error;
mod kv;
pub mod metrics;
mod record;
pub mod request;
mod run;
pub mod tenants;
mod tiers;
pub mod validation;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub use error::ServiceError;
pub use metrics::Metrics;
pub use request::{ChatMessage, Chunk, ChunkStream, Generation, Outcome, Request};
pub use tenants::{TenantAuth, TenantsError};

use crate::background::Background;
use crate::backend::cpu::CpuBackend;
use crate::cache::indexer::{FactIndexer, IdleFn, IndexFn, IndexerConfig};
use crate::cache::semantic::{LazyEmbedder, SemanticCache, SemanticConfig};
use crate::cache::ExactCache;
use crate::embed::{Embedder, MatrixFormat};
use crate::engine::chat::{ChatError, ChatTemplate};
use crate::engine::placement::{place, PlacementOptions};
use crate::engine::scheduler::{Scheduler, SchedulerConfig};
use crate::engine::tokenizer::{Tokenizer, TokenizerError};
use crate::engine::{Model, ModelError};
use crate::store::{DbCheck, Store, StoreError};
use crate::workload::{KvConfig, KvWorkload, WorkloadError};

/// How to run the pipeline: the model, the database, the caches, the engine.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Path of the GGUF model file.
    pub model: PathBuf,
    /// `--db`: a SQLite file, or a `postgres://` URL (see `Store::open_with`).
    pub db: PathBuf,
    /// CPU threads for the model (0 = physical cores).
    pub threads: usize,
    /// `false` (`--no-cache`): every request runs as BYPASS.
    pub cache: bool,
    /// API keys per tenant; `None` = tenants named by the `x-forge-tenant` header.
    pub tenants: Option<PathBuf>,
    /// Settings of the engine thread.
    pub scheduler: SchedulerConfig,
    /// max_tokens of a request that does not set it.
    pub default_max_tokens: usize,
    /// Answers the exact cache keeps in memory.
    pub memory_cache_entries: u64,
    /// The sentence embedder's folder (semantic tier); `None` or a missing folder turns the
    /// semantic tier off.
    pub embedder: Option<PathBuf>,
    /// How the embedder holds its matrices (F16: half the bytes per question; see `MatrixFormat`).
    pub embed_weights: MatrixFormat,
    /// Settings of the semantic tier.
    pub semantic: SemanticConfig,
    /// Which layers run on the CPU and which on the GPU (`--backend`, `--tensor-split`).
    pub placement: PlacementOptions,
    /// KV-block reuse (`None`: off).
    pub kv: Option<KvConfig>,
    /// How an existing database is checked before it is used (`--db-check`).
    pub db_check: DbCheck,
    /// Per tenant: the cache mode of requests that leave it unset (or say AUTO).
    pub tenant_modes: std::collections::HashMap<String, crate::vocab::CacheMode>,
}

impl PipelineConfig {
    pub fn new(model: impl Into<PathBuf>, db: impl Into<PathBuf>) -> PipelineConfig {
        PipelineConfig {
            model: model.into(),
            db: db.into(),
            threads: 0,
            cache: true,
            tenants: None,
            scheduler: SchedulerConfig::default(),
            default_max_tokens: 256,
            memory_cache_entries: 10_000,
            embedder: Some(crate::models::default_embedder()),
            embed_weights: MatrixFormat::F16,
            semantic: SemanticConfig::default(),
            placement: PlacementOptions::default(),
            kv: Some(KvConfig::default()),
            db_check: DbCheck::default(),
            tenant_modes: Default::default(),
        }
    }
}

/// Where start-up time went: (phase, time), in order (`serve` logs it).
pub type StartupPhases = Vec<(&'static str, std::time::Duration)>;

/// Times the phases of [`Pipeline::load`]: (the phases so far, when loading began, when the
/// last phase ended).
struct Phases(StartupPhases, std::time::Instant, std::time::Instant);

impl Default for Phases {
    fn default() -> Phases {
        let now = std::time::Instant::now();
        Phases(Vec::new(), now, now)
    }
}

impl Phases {
    /// When loading began.
    fn started(&self) -> std::time::Instant {
        self.1
    }

    fn done(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.0.push((phase, now - self.2));
        self.2 = now;
    }
}

/// Why the pipeline could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", crate::models::missing_hint(.0))]
    MissingModel(PathBuf),
    #[error("loading {}: {source}", path.display())]
    Model {
        path: PathBuf,
        #[source]
        source: ModelError,
    },
    #[error("reading {}: {source}", path.display())]
    ModelFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the model's tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("the model's chat template: {0}")]
    Chat(#[from] ChatError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("tenants file {0}")]
    Tenants(#[from] TenantsError),
    #[error("the sentence embedder: {0}")]
    Embedder(#[source] crate::embed::EmbedError),
    #[error("the backend: {0}")]
    Backend(String),
    #[error("starting the engine thread: {0}")]
    Engine(std::io::Error),
    #[error("KV-block reuse: {0}")]
    Kv(#[from] WorkloadError),
}

/// What every request shares: the model's tokenizer and template, the engine, the store, the
/// caches, tenant auth, metrics.
pub struct Pipeline {
    /// The model file's name without `.gguf`.
    pub(crate) model_name: String,
    /// sha256 of the model file.
    pub(crate) model_id: String,
    /// Context length the model was trained for, tokens (caps max_tokens).
    pub(crate) context: usize,
    /// Where the layers run, for records (`Model::placement`).
    pub(crate) backend: String,
    /// Built on its own thread at start-up ([`Pipeline::tokenizer`] waits for it).
    pub(crate) tokenizer: Background<Arc<Tokenizer>>,
    /// The model's chat template; `None` when the file has none.
    pub(crate) template: Option<ChatTemplate>,
    /// Handle to the engine thread.
    pub(crate) scheduler: Scheduler,
    /// The database.
    pub(crate) store: Arc<Store>,
    /// The exact cache (memory over the store's rows).
    pub(crate) exact: ExactCache,
    /// How requests name and prove their tenant.
    pub(crate) auth: TenantAuth,
    /// `false` (`--no-cache`): every request runs as BYPASS.
    pub(crate) cache_enabled: bool,
    /// max_tokens of a request that does not set it (capped by `context`).
    pub(crate) default_max_tokens: usize,
    /// The semantic tier (`None`: off).
    pub(crate) semantic: Option<Arc<SemanticCache>>,
    /// KV-block reuse (`None`: off).
    pub(crate) kv: Option<Arc<KvWorkload>>,
    /// BLEND: the fraction of document tokens recomputed, unless a request says otherwise.
    pub(crate) blend_recompute: f32,
    /// Generate calls in progress (from arrival to their last message).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Embeds new facts while no request runs (with the semantic tier).
    pub(crate) fact_indexer: Option<FactIndexer>,
    /// The service's Prometheus metrics.
    pub(crate) metrics: Metrics,
    /// Per tenant: the cache mode of requests that leave it unset.
    pub(crate) tenant_modes: std::collections::HashMap<String, crate::vocab::CacheMode>,
    /// The next request id (logs and traces).
    next_request: AtomicU64,
    /// Where [`Pipeline::load`] spent its time.
    pub(crate) startup: StartupPhases,
}

impl Pipeline {
    /// Loads the model and the configuration, then opens (or creates) the store: no file is
    /// created before everything it depends on has loaded. Starts the engine. Blocking.
    pub fn load(config: &PipelineConfig) -> Result<Pipeline, LoadError> {
        let mut phases = Phases::default();
        let auth = match &config.tenants {
            Some(path) => TenantAuth::load(path)?,
            None => TenantAuth::Open,
        };
        if !config.model.is_file() {
            return Err(LoadError::MissingModel(config.model.clone()));
        }
        let backend = Arc::new(CpuBackend::new(config.threads).map_err(|e| LoadError::Backend(e.to_string()))?);
        let engine_cpu = backend.clone();
        let mut model = Model::load_unprepared(&config.model, backend).map_err(|source| LoadError::Model { path: config.model.clone(), source })?;
        // The CPU's copies of its matrices are made by the engine thread (off the path of an
        // EXACT answer after a restart); an automatic split's calibration times the CPU on the
        // mapped layout, a little slower than the repacked one.
        let placement = place(&mut model, &config.placement).map_err(|e| LoadError::Backend(e.to_string()))?;
        tracing::info!(placement = %placement, layers = %model.placement(), "model placed");
        let model = Arc::new(model);
        phases.done("model (map, check, place)");
        // The tokenizer (~50 ms for SmolLM2's 49,152 tokens) is built on its own thread while
        // the service starts: an EXACT hit does not need it; the first request that does waits.
        let tokenizer = {
            let (model, started) = (model.clone(), phases.started());
            Background::spawn("forge-tokenizer", move || {
                let built = Tokenizer::from_gguf(&model.gguf).map(Arc::new).map_err(|e| LoadError::Tokenizer(e).to_string());
                let ms = |d: std::time::Duration| format!("{:.1}", d.as_secs_f64() * 1e3);
                match &built {
                    Ok(_) => tracing::info!(since_load_ms = %ms(started.elapsed()), "tokenizer built (in the background)"),
                    Err(e) => tracing::error!(error = %e, "the model's tokenizer did not build: requests that need it fail"),
                }
                built
            })
            .map_err(LoadError::Engine)?
        };
        let template = ChatTemplate::from_gguf(&model.gguf)?;
        phases.done("chat template (tokenizer building in the background)");
        // The sentence embedder loads on its own thread while the service starts: exact hits
        // and facts do not need it; the first question that does waits for it.
        let embedder = match config.embedder.as_ref().filter(|dir| config.cache && dir.join("tokenizer.json").is_file()) {
            Some(dir) => {
                let (dir, weights) = (dir.clone(), config.embed_weights);
                let load = move || {
                    // One thread: embedding runs beside the engine's own thread team.
                    let backend = Arc::new(CpuBackend::new(1).map_err(|e| e.to_string())?);
                    Embedder::load_with(&dir, backend, weights).map_err(|e| format!("{}: {e}", dir.display()))
                };
                Some(LazyEmbedder::load_in_background(load).map_err(LoadError::Engine)?)
            }
            None => None,
        };
        let store = Arc::new(Store::open_with(&config.db, config.db_check)?);
        phases.done("database (open, check, migrate)");
        let identity = store.model_identity(&config.model)?;
        let model_id = identity.sha256;
        phases.done(if identity.hashed_now { "model id (full SHA-256, first start)" } else { "model id (remembered)" });
        let model_name = config.model.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        let context = model.config.n_ctx_train;
        let backend = model.placement();
        let kv = match &config.kv {
            Some(c) => Some(Arc::new(KvWorkload::open(c, &store, &model.config, &model_id)?)),
            None => None,
        };
        phases.done("KV-block tier");
        let in_flight = Arc::new(AtomicUsize::new(0));
        let scheduler = Scheduler::start_loading(model, tokenizer.clone(), config.scheduler).map_err(LoadError::Engine)?;
        phases.done("engine thread");
        let semantic = match (&config.embedder, embedder) {
            (Some(_), Some(embedder)) => {
                // A question arriving while no other request is in flight (the engine is idle)
                // borrows the engine's team: the hit path is mostly this embedding.
                let mut sem = SemanticCache::new(embedder, store.clone(), config.semantic);
                if engine_cpu.threads() > 1 {
                    let busy = in_flight.clone();
                    let alone: Arc<IdleFn> = Arc::new(move || busy.load(Ordering::Relaxed) <= 1);
                    sem = sem.with_idle_backend(engine_cpu, alone);
                }
                Some(Arc::new(sem))
            }
            (Some(dir), None) if config.cache => {
                tracing::warn!(dir = %dir.display(), "semantic cache off: no embedder there (scripts/fetch-models.sh fetches it)");
                None
            }
            _ => None,
        };
        let fact_indexer = match &semantic {
            Some(sem) => {
                let (sem, busy) = (sem.clone(), in_flight.clone());
                let index: Arc<IndexFn> = Arc::new(move |tenant: &str, limit: usize| sem.index_new_facts(tenant, limit).map_err(|e| e.to_string()));
                let idle: Arc<IdleFn> = Arc::new(move || busy.load(Ordering::Relaxed) == 0);
                let ix = FactIndexer::spawn(IndexerConfig::default(), idle, index).map_err(LoadError::Engine)?;
                // Facts left unindexed by an earlier run.
                for tenant in store.tenants_with_unindexed_facts()? {
                    ix.notify(&tenant);
                }
                Some(ix)
            }
            None => None,
        };
        phases.done("semantic tier, fact indexer (embedder loading in the background)");
        Ok(Pipeline {
            in_flight,
            fact_indexer,
            model_name,
            model_id,
            context,
            backend,
            tokenizer,
            template,
            scheduler,
            exact: ExactCache::new(store.clone(), config.memory_cache_entries),
            store,
            auth,
            cache_enabled: config.cache,
            default_max_tokens: config.default_max_tokens,
            semantic,
            kv,
            blend_recompute: config.kv.as_ref().map_or(crate::workload::DEFAULT_BLEND_RECOMPUTE, |k| k.blend_recompute),
            metrics: Metrics::new(),
            tenant_modes: config.tenant_modes.clone(),
            next_request: AtomicU64::new(1),
            startup: phases.0,
        })
    }

    /// The served model's name (its file name without `.gguf`).
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// Where loading spent its time, in order.
    pub fn startup(&self) -> &StartupPhases {
        &self.startup
    }

    /// The model's tokenizer; just after start-up it may still be being built, and then this
    /// waits for it (observed as the stage `tokenizer_wait`). Blocking.
    pub(crate) fn tokenizer(&self) -> Result<&Tokenizer, ServiceError> {
        let built = match self.tokenizer.try_get() {
            Some(built) => built,
            None => {
                let t = std::time::Instant::now();
                let built = self.tokenizer.get();
                self.metrics.stage("tokenizer_wait", t.elapsed());
                built
            }
        };
        built.map(|t| &**t).map_err(|e| ServiceError::Internal(e.to_string()))
    }

    /// sha256 of the served model file.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The model's context, in tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Tenant resolution, for the front ends.
    pub fn auth(&self) -> &TenantAuth {
        &self.auth
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The Prometheus text exposition of the metrics, with the gauges read now.
    pub fn render_metrics(&self) -> String {
        let kv_memory = self.kv.as_ref().map(|kv| kv.usage().0 .0);
        self.metrics.render(self.scheduler.queued(), self.scheduler.active(), self.in_flight.load(Ordering::Relaxed), kv_memory)
    }

    fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}
