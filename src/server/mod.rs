//! The gRPC service (`proto/forge/v1/forge.proto`, tonic): `Generate` through the tiers FACT →
//! EXACT → MODEL, `GetStats`, `SearchFacts`, `PutFact`, `InvalidateFacts`, plus server
//! reflection (v1 and v1alpha) and `grpc.health.v1`, so `grpcurl` works unchanged.
//!
//! * `proto` — generated code, descriptor set, enum conversions
//! * `error` — [`ServiceError`] and its one mapping to `tonic::Status`
//! * `tenants` — tenant from header or API key
//! * `generate` — validating a request, the tiers, streaming, recording
//! * `service` — the tonic trait implementation
//! * `client` — a small client (tenant / key headers, collecting a Generate stream), used by the
//!   CLI and the tests
//!
//! Threads: the engine runs on its own thread ([`crate::engine::scheduler`]) with the CPU
//! backend's pool; SQLite calls and question embeddings run on tokio's blocking pool; new facts
//! are embedded on the fact indexer's low-priority thread while no request is in flight
//! ([`crate::cache::indexer`]); the async runtime itself needs only a couple of workers.

pub mod client;
pub mod codec;
mod error;
mod generate;
pub mod proto;
mod service;
pub mod tenants;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

pub use error::ServiceError;
pub use tenants::{TenantAuth, TenantsError};

use crate::backend::cpu::CpuBackend;
use crate::cache::indexer::{FactIndexer, IdleFn, IndexFn, IndexerConfig};
use crate::cache::semantic::{LazyEmbedder, SemanticCache, SemanticConfig};
use crate::cache::ExactCache;
use crate::embed::{Embedder, MatrixFormat};
use crate::engine::chat::{ChatError, ChatTemplate};
use crate::engine::scheduler::{Scheduler, SchedulerConfig};
use crate::engine::tokenizer::{Tokenizer, TokenizerError};
use crate::engine::placement::{place, PlacementOptions};
use crate::engine::{Model, ModelError};
use crate::store::{DbCheck, Store, StoreError};
use crate::workload::{KvConfig, KvWorkload, WorkloadError};

/// How to run the service.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub model: PathBuf,
    pub db: PathBuf,
    /// CPU threads for the model (0 = physical cores).
    pub threads: usize,
    /// `false` (`--no-cache`): every request runs as BYPASS.
    pub cache: bool,
    /// API keys per tenant; `None` = tenants named by the `x-forge-tenant` header.
    pub tenants: Option<PathBuf>,
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
    pub semantic: SemanticConfig,
    /// Which layers run on the CPU and which on the GPU (`--backend`, `--tensor-split`).
    pub placement: PlacementOptions,
    /// KV-block reuse (`None`: off).
    pub kv: Option<KvConfig>,
    /// How an existing database is checked before it is used (`--db-check`).
    pub db_check: DbCheck,
}

impl ServerConfig {
    pub fn new(model: impl Into<PathBuf>, db: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
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
        }
    }
}

/// Where start-up time went: (phase, time), in order (`serve` prints it).
pub type StartupPhases = Vec<(&'static str, std::time::Duration)>;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
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
    #[error("binding {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("server reflection: {0}")]
    Reflection(String),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("KV-block reuse: {0}")]
    Kv(#[from] WorkloadError),
    #[error("start-up task failed: {0}")]
    Join(String),
}

/// What the request handlers share: the model's tokenizer and template, the engine, the store,
/// the exact cache, tenant auth.
pub struct ForgeState {
    pub(crate) model_name: String,
    pub(crate) model_id: String,
    pub(crate) context: usize,
    pub(crate) backend: String,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) scheduler: Scheduler,
    pub(crate) store: Arc<Store>,
    pub(crate) exact: ExactCache,
    pub(crate) auth: TenantAuth,
    pub(crate) cache_enabled: bool,
    pub(crate) default_max_tokens: usize,
    pub(crate) semantic: Option<Arc<SemanticCache>>,
    /// KV-block reuse (`None`: off).
    pub(crate) kv: Option<Arc<KvWorkload>>,
    /// Generate calls in progress (from arrival to their last message).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Embeds new facts while no request runs (with the semantic tier).
    pub(crate) fact_indexer: Option<FactIndexer>,
    /// Where [`ForgeState::load`] spent its time.
    pub(crate) startup: StartupPhases,
}

/// Times the phases of [`ForgeState::load`].
struct Phases(StartupPhases, std::time::Instant);

impl Default for Phases {
    fn default() -> Phases {
        Phases(Vec::new(), std::time::Instant::now())
    }
}

impl Phases {
    fn done(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.0.push((phase, now - self.1));
        self.1 = now;
    }
}

impl ForgeState {
    /// Loads the model and the configuration, then opens (or creates) the store: no file is
    /// created before everything it depends on has loaded. Starts the engine. Blocking.
    pub fn load(config: &ServerConfig) -> Result<ForgeState, ServerError> {
        let mut phases = Phases::default();
        let auth = match &config.tenants {
            Some(path) => TenantAuth::load(path)?,
            None => TenantAuth::Open,
        };
        if !config.model.is_file() {
            return Err(ServerError::MissingModel(config.model.clone()));
        }
        let backend = Arc::new(CpuBackend::new(config.threads).map_err(|e| ServerError::Backend(e.to_string()))?);
        let engine_cpu = backend.clone();
        let mut model = Model::load(&config.model, backend).map_err(|source| ServerError::Model { path: config.model.clone(), source })?;
        let placement = place(&mut model, &config.placement).map_err(|e| ServerError::Backend(e.to_string()))?;
        eprintln!("forge-cache: layers {placement}: {}", model.placement());
        phases.done("model (map, check, place)");
        let tokenizer = Arc::new(Tokenizer::from_gguf(&model.gguf)?);
        let template = ChatTemplate::from_gguf(&model.gguf)?;
        phases.done("tokenizer and chat template");
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
                Some(LazyEmbedder::load_in_background(load).map_err(ServerError::Engine)?)
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
            Some(c) => Some(Arc::new(KvWorkload::open(c, store.clone(), &model.config, &model_id)?)),
            None => None,
        };
        phases.done("KV-block tier");
        let in_flight = Arc::new(AtomicUsize::new(0));
        let scheduler = Scheduler::start(Arc::new(model), tokenizer.clone(), config.scheduler).map_err(ServerError::Engine)?;
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
                eprintln!(
                    "forge-cache: semantic cache off: no embedder in {} (scripts/fetch-models.sh fetches it)",
                    dir.display()
                );
                None
            }
            _ => None,
        };
        let fact_indexer = match &semantic {
            Some(sem) => {
                let (sem, busy) = (sem.clone(), in_flight.clone());
                let index: Arc<IndexFn> = Arc::new(move |tenant: &str, limit: usize| sem.index_new_facts(tenant, limit).map_err(|e| e.to_string()));
                let idle: Arc<IdleFn> = Arc::new(move || busy.load(Ordering::Relaxed) == 0);
                let ix = FactIndexer::spawn(IndexerConfig::default(), idle, index).map_err(ServerError::Engine)?;
                // Facts left unindexed by an earlier run.
                for tenant in store.tenants_with_unindexed_facts()? {
                    ix.notify(&tenant);
                }
                Some(ix)
            }
            None => None,
        };
        phases.done("semantic tier, fact indexer (embedder loading in the background)");
        Ok(ForgeState {
            startup: phases.0,
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
        })
    }
}

/// Serves `state` on `listener` until `shutdown` completes.
pub async fn serve(state: Arc<ForgeState>, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    use proto::forge_server::ForgeServer;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<ForgeServer<service::ForgeService>>().await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1().map_err(|e| ServerError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(|e| ServerError::Reflection(e.to_string()))?;
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(ForgeServer::new(service::ForgeService::new(state)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

/// A service running in the current tokio runtime.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub model_name: String,
    pub model_id: String,
    /// Where loading spent its time, in order.
    pub startup: StartupPhases,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// `http://ADDR`, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting calls, ends the running ones, waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.map_err(|e| ServerError::Join(e.to_string()))?
    }

    /// Waits until the server ends (an error, or the shutdown future of [`start_with_shutdown`]).
    pub async fn wait(mut self) -> Result<(), ServerError> {
        (&mut self.task).await.map_err(|e| ServerError::Join(e.to_string()))?
    }
}

/// Loads everything (off the async workers) and serves on `addr` (`127.0.0.1:0` = any free port).
pub async fn start(config: ServerConfig, addr: &str) -> Result<RunningServer, ServerError> {
    start_with_shutdown(config, addr, std::future::pending()).await
}

/// As [`start`]; the server also stops when `shutdown` completes (e.g. Ctrl-C).
pub async fn start_with_shutdown(
    config: ServerConfig,
    addr: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let state = tokio::task::spawn_blocking(move || ForgeState::load(&config)).await.map_err(|e| ServerError::Join(e.to_string()))??;
    let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr: addr.to_string(), source })?;
    let local = listener.local_addr().map_err(|source| ServerError::Bind { addr: addr.to_string(), source })?;
    let (tx, rx) = oneshot::channel::<()>();
    let (model_name, model_id, startup) = (state.model_name.clone(), state.model_id.clone(), state.startup.clone());
    let state = Arc::new(state);
    let task = tokio::spawn(async move {
        let stop = async move {
            tokio::select! {
                _ = rx => {}
                _ = shutdown => {}
            }
        };
        let result = serve(state.clone(), listener, stop).await;
        // The engine thread is joined when the last reference goes; do that off the async workers.
        let _ = tokio::task::spawn_blocking(move || drop(state)).await;
        result
    });
    Ok(RunningServer { addr: local, model_name, model_id, startup, shutdown: Some(tx), task })
}
