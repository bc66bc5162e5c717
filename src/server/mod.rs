//! The front ends and the process that runs them: the gRPC service (`proto/forge/v1/forge.proto`,
//! tonic) with server reflection (v1 and v1alpha) and `grpc.health.v1`, so `grpcurl` works
//! unchanged, and the OpenAI-compatible HTTP API ([`http`], axum) with `/metrics` and `/health`,
//! both on one tokio runtime in one process over one [`Pipeline`]. The front ends only
//! translate: validation, the tiers, the engine and recording live in [`crate::pipeline`].
//!
//! * `proto` — generated code, descriptor set, conversions to and from the pipeline's words
//! * `error` — the one mapping of [`ServiceError`] to `tonic::Status`
//! * `codec` — reading request messages: undecodable ones are `INVALID_ARGUMENT`, ones over the
//!   size limit `RESOURCE_EXHAUSTED` (the one mapping of wire-level failures)
//! * `service` — the tonic trait implementation
//! * `http` — the HTTP API (routes, OpenAI JSON, SSE, its one error mapping)
//! * `client` — a small gRPC client (tenant / key headers, collecting a Generate stream), used by
//!   the CLI and the tests
//!
//! Start-up: the HTTP listener comes up first and answers `/health` with 503 while the model
//! loads; the gRPC listener comes up once the pipeline is ready.

pub mod client;
pub mod codec;
mod error;
pub mod http;
pub mod proto;
mod service;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

pub use crate::pipeline::tenants::{self, TenantAuth, TenantsError};
pub use crate::pipeline::{LoadError, Pipeline, PipelineConfig, ServiceError, StartupPhases};

/// How to run the service (the pipeline's configuration; the addresses are given to
/// [`start_listening`]).
pub type ServerConfig = PipelineConfig;

/// The HTTP API's address unless told otherwise.
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";

/// Where the service listens.
#[derive(Debug, Clone)]
pub struct Listen {
    /// The gRPC address (port 0 = any free port).
    pub grpc: String,
    /// The HTTP address (`None`: no HTTP API).
    pub http: Option<String>,
    /// The largest gRPC request message accepted, in bytes (`serve --max-message-mb`).
    pub max_message_bytes: usize,
}

impl Listen {
    /// gRPC on `grpc`, no HTTP API, the default message limit.
    pub fn grpc(grpc: &str) -> Listen {
        Listen { grpc: grpc.to_string(), http: None, max_message_bytes: codec::DEFAULT_MAX_MESSAGE_BYTES }
    }
}

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Load(#[from] LoadError),
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
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    #[error("start-up task failed: {0}")]
    Join(String),
}

impl ServerError {
    /// The database or model problem behind a start-up failure, when it is one.
    pub fn load_error(&self) -> Option<&LoadError> {
        match self {
            ServerError::Load(e) => Some(e),
            _ => None,
        }
    }
}

/// Accepted connections with `TCP_NODELAY`: HTTP/2 writes a response's headers, data and
/// trailers as separate small writes, and with Nagle's algorithm on, the later ones waited for
/// the client's delayed ACK — 40 ms on Linux loopback, on about half of the answers (measured:
/// an EXACT hit 36 ms or 73-78 ms from launch; the answer itself took 0.3 ms inside serve).
/// tonic sets it only on listeners it binds itself.
fn no_delay(incoming: TcpListenerStream) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    incoming.map(|accepted| {
        let stream = accepted?;
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        Ok(stream)
    })
}

/// Serves `state` on `listener` until `shutdown` completes; request messages over
/// `max_message_bytes` are refused ([`codec::too_large`]).
pub async fn serve(
    state: Arc<Pipeline>,
    listener: TcpListener,
    max_message_bytes: usize,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
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
        .add_service(codec::MessageLimit::new(
            // tonic's own limit (OUT_OF_RANGE) is the same, so MessageLimit always answers first.
            ForgeServer::new(service::ForgeService::new(state)).max_decoding_message_size(max_message_bytes),
            max_message_bytes,
        ))
        .serve_with_incoming_shutdown(no_delay(TcpListenerStream::new(listener)), shutdown)
        .await?;
    Ok(())
}

/// A service running in the current tokio runtime.
pub struct RunningServer {
    /// The gRPC address.
    pub addr: SocketAddr,
    /// The HTTP API's address (`None`: off).
    pub http_addr: Option<SocketAddr>,
    /// The served model's name (its file stem).
    pub model_name: String,
    /// sha256 of the served model file.
    pub model_id: String,
    /// Where loading the pipeline spent its time, in order (`serve` logs it).
    pub startup: StartupPhases,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// `http://ADDR` of the gRPC service, for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR` of the HTTP API (`None`: off).
    pub fn http_url(&self) -> Option<String> {
        self.http_addr.map(|a| format!("http://{a}"))
    }

    /// Stops accepting calls, ends the running ones, waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        let _ = self.shutdown.send(true);
        (&mut self.task).await.map_err(|e| ServerError::Join(e.to_string()))?
    }

    /// Waits until the server ends (an error, or the shutdown future of [`start_listening`]).
    pub async fn wait(mut self) -> Result<(), ServerError> {
        (&mut self.task).await.map_err(|e| ServerError::Join(e.to_string()))?
    }
}

/// Loads everything (off the async workers) and serves gRPC on `addr` (`127.0.0.1:0` = any free
/// port); no HTTP API.
pub async fn start(config: ServerConfig, addr: &str) -> Result<RunningServer, ServerError> {
    start_with_shutdown(config, addr, std::future::pending()).await
}

/// As [`start`]; the server also stops when `shutdown` completes (e.g. Ctrl-C).
pub async fn start_with_shutdown(
    config: ServerConfig,
    addr: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    start_listening(config, Listen::grpc(addr), shutdown).await
}

/// Binds the HTTP API first (it answers `/health` with 503 while loading), loads the pipeline
/// off the async workers, then serves gRPC; both stop when `shutdown` completes or
/// [`RunningServer::stop`] is called. Returns once the pipeline is ready.
pub async fn start_listening(
    config: ServerConfig,
    listen: Listen,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunningServer, ServerError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let signal = stop_tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown => { let _ = signal.send(true); }
            _ = signal.closed() => {}
        }
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let slot = Arc::new(http::Slot::default());
    let (http_addr, http_task) = match &listen.http {
        Some(addr) => {
            let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr: addr.clone(), source })?;
            let local = listener.local_addr().map_err(|source| ServerError::Bind { addr: addr.clone(), source })?;
            tracing::info!(addr = %local, "HTTP API listening (health 503 until the model is loaded)");
            let task = tokio::spawn(http::serve(slot.clone(), listener, stopped(stop_rx.clone())));
            (Some(local), Some(task))
        }
        None => (None, None),
    };
    let loaded = tokio::task::spawn_blocking(move || Pipeline::load(&config)).await.map_err(|e| ServerError::Join(e.to_string()));
    let state = match loaded.and_then(|r| r.map_err(ServerError::from)) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            let _ = stop_tx.send(true);
            if let Some(t) = http_task {
                let _ = t.await;
            }
            return Err(e);
        }
    };
    let bound = match TcpListener::bind(&listen.grpc).await {
        Ok(l) => l.local_addr().map(|a| (l, a)),
        Err(e) => Err(e),
    };
    let (listener, local) = match bound {
        Ok(b) => b,
        Err(source) => {
            let _ = stop_tx.send(true);
            if let Some(t) = http_task {
                let _ = t.await;
            }
            let _ = tokio::task::spawn_blocking(move || drop(state)).await;
            return Err(ServerError::Bind { addr: listen.grpc.clone(), source });
        }
    };
    slot.set(state.clone());
    let (model_name, model_id, startup) = (state.model_name.clone(), state.model_id.clone(), state.startup().clone());
    let grpc_stop = stopped(stop_rx.clone());
    let max_message_bytes = listen.max_message_bytes;
    let task = tokio::spawn(async move {
        let grpc = serve(state.clone(), listener, max_message_bytes, grpc_stop).await;
        let http = match http_task {
            Some(t) => t.await.map_err(|e| ServerError::Join(e.to_string())).and_then(|r| r.map_err(ServerError::Http)),
            None => Ok(()),
        };
        slot.clear();
        // The engine thread is joined when the last reference goes; do that off the async workers.
        let _ = tokio::task::spawn_blocking(move || drop(state)).await;
        grpc.and(http)
    });
    Ok(RunningServer { addr: local, http_addr, model_name, model_id, startup, shutdown: stop_tx, task })
}
