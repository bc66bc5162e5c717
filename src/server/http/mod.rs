//! The OpenAI-compatible HTTP API (axum, on the service's tokio runtime), a front end that only
//! translates: `POST /v1/chat/completions` and `POST /v1/completions` become a
//! [`crate::pipeline::Request`] and the pipeline's pieces become OpenAI's JSON, or server-sent
//! events ending with `data: [DONE]` when `stream` is true. Also `GET /v1/models`, `GET /health`
//! (503 while the model loads, then 200) and `GET /metrics` (Prometheus text).
//!
//! Tenants: `Authorization: Bearer KEY` with the same tenants file as gRPC (`serve --tenants`),
//! or the `x-forge-tenant` header when the service runs without one. Cache mode: the
//! `x-forge-cache-mode` header or the `cache_mode` body field. Every answer says which tier
//! served it: the `x-forge-served-from` header and the `served_from` body field (a stream's
//! header says `MODEL` when the engine runs; its last chunk says whether the answer then turned
//! out VERIFIED or PARTIAL). Errors are OpenAI's error JSON with a 4xx/5xx status
//! ([`error::ApiError`], the one mapping).

pub mod error;
pub mod openai;

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;

use self::error::ApiError;
use self::openai::{Kind, Parsed};
use crate::pipeline::{Generation, Pipeline};
use crate::vocab::{CacheMode, ServedFrom};

/// The largest request body read (a whole context of text is ~50 KB); larger is 413.
pub const MAX_BODY_BYTES: usize = 2 << 20;
/// Request header: the cache mode (`auto`, `bypass`, `refresh`, `verified`, `trust`, `exact`).
pub const CACHE_MODE_HEADER: &str = "x-forge-cache-mode";
/// Response header: the tier that served the answer.
pub const SERVED_FROM_HEADER: &str = "x-forge-served-from";

/// The pipeline, once loaded (the listener is up before that).
#[derive(Default)]
pub struct Slot(RwLock<Option<Arc<Pipeline>>>);

impl Slot {
    pub fn get(&self) -> Option<Arc<Pipeline>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, p: Arc<Pipeline>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(p);
    }

    pub fn clear(&self) {
        self.0.write().unwrap_or_else(|p| p.into_inner()).take();
    }
}

type AppState = Arc<Slot>;

/// The routes, over whatever pipeline `slot` holds.
pub fn router(slot: Arc<Slot>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "no such route").with_code("unknown_url") })
        .method_not_allowed_fallback(|| async { ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method not allowed on this route") })
        .with_state(slot)
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(slot: Arc<Slot>, listener: TcpListener, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // TCP_NODELAY, as for gRPC (`server::no_delay`): a response's small writes do not wait for
    // the client's delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
    });
    axum::serve(listener, router(slot)).with_graceful_shutdown(shutdown).await
}

fn loaded(slot: &Slot) -> Result<Arc<Pipeline>, ApiError> {
    slot.get().ok_or_else(ApiError::loading)
}

async fn health(State(slot): State<AppState>) -> Response {
    match slot.get() {
        Some(p) => axum::Json(serde_json::json!({ "status": "ok", "model": p.model_name() })).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({ "status": "loading" }))).into_response(),
    }
}

async fn metrics(State(slot): State<AppState>) -> Response {
    match loaded(&slot) {
        Ok(p) => ([(header::CONTENT_TYPE, crate::pipeline::metrics::CONTENT_TYPE)], p.render_metrics()).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The tenant of a call (the same rules and file as gRPC).
fn tenant(p: &Pipeline, headers: &HeaderMap) -> Result<String, ApiError> {
    p.auth().resolve(&MetadataMap::from_headers(headers.clone()), "").map_err(ApiError::from)
}

async fn models(State(slot): State<AppState>, headers: HeaderMap) -> Response {
    let run = || -> Result<Response, ApiError> {
        let p = loaded(&slot)?;
        tenant(&p, &headers)?;
        let model = serde_json::json!({ "id": p.model_name(), "object": "model", "created": 0, "owned_by": "forge-cache", "forge_model_id": p.model_id() });
        Ok(axum::Json(serde_json::json!({ "object": "list", "data": [model] })).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

async fn chat(State(slot): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    complete(Kind::Chat, slot, headers, body).await
}

async fn completions(State(slot): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    complete(Kind::Completion, slot, headers, body).await
}

/// The body as one JSON object: 413 past [`MAX_BODY_BYTES`] (by its Content-Length before
/// anything is read), 400 for invalid UTF-8 or JSON.
async fn read_json(headers: &HeaderMap, body: Body) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let too_large = || ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", format!("the request body is larger than {MAX_BODY_BYTES} bytes"));
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) {
            too_large()
        } else {
            ApiError::invalid(format!("reading the request body failed: {e}"))
        }
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| ApiError::invalid(format!("the request body is not valid UTF-8 ({e})")))?;
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object")),
        Err(e) => Err(ApiError::invalid(format!("the request body is not valid JSON: {e}"))),
    }
}

/// The cache mode from the header and the body field (they must agree when both are given).
fn cache_mode(headers: &HeaderMap, parsed: &Parsed) -> Result<CacheMode, ApiError> {
    let header = match headers.get(CACHE_MODE_HEADER) {
        None => None,
        Some(v) => {
            let s = v.to_str().map_err(|_| ApiError::invalid(format!("the {CACHE_MODE_HEADER} header is not ASCII text")))?;
            Some(openai::parse_cache_mode(s).map_err(ApiError::invalid)?)
        }
    };
    match (header, parsed.cache_mode) {
        (Some(h), Some(b)) if h != b => Err(ApiError::param("cache_mode", format!("the {CACHE_MODE_HEADER} header says {h} but cache_mode says {b}"))),
        (h, b) => Ok(h.or(b).unwrap_or_default()),
    }
}

/// Everything before the pipeline: loaded, tenant, body, fields.
async fn prepare(kind: Kind, slot: &Slot, headers: &HeaderMap, body: Body) -> Result<(Arc<Pipeline>, String, Parsed), (Option<Arc<Pipeline>>, ApiError)> {
    let p = loaded(slot).map_err(|e| (None, e))?;
    let fail = |e: ApiError| (Some(p.clone()), e);
    let tenant = tenant(&p, headers).map_err(fail)?;
    let body = read_json(headers, body).await.map_err(fail)?;
    let mut parsed = openai::parse(kind, &body).map_err(fail)?;
    parsed.request.cache_mode = cache_mode(headers, &parsed).map_err(fail)?;
    Ok((p, tenant, parsed))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

async fn complete(kind: Kind, slot: AppState, headers: HeaderMap, body: Body) -> Response {
    let (p, tenant, parsed) = match prepare(kind, &slot, &headers, body).await {
        Ok(x) => x,
        Err((p, e)) => {
            if let Some(p) = p {
                p.metrics.rejected_code(e.metric_code());
                tracing::info!(status = e.status.as_u16(), error = %e.message, "HTTP request refused");
            }
            return e.into_response();
        }
    };
    let generation = match p.generate(tenant, parsed.request).await {
        Ok(g) => g,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let created = unix_now();
    let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{created:x}{:06x}", generation.request_id);
    if parsed.stream {
        return stream(kind, id, created, p.model_name().to_string(), parsed.include_usage, generation);
    }
    match collect(generation).await {
        Ok((text, outcome)) => {
            let mut r = axum::Json(openai::completion(kind, &id, created, &text, &outcome)).into_response();
            r.headers_mut().insert(SERVED_FROM_HEADER, header_value(outcome.served_from.as_str()));
            r.headers_mut().insert(CACHE_MODE_HEADER, header_value(outcome.cache_mode.as_str()));
            r
        }
        Err(e) => e.into_response(),
    }
}

/// The whole answer of a request that does not stream.
async fn collect(mut g: Generation) -> Result<(String, crate::pipeline::Outcome), ApiError> {
    let mut text = String::new();
    while let Some(piece) = g.chunks.next().await {
        let piece = piece.map_err(ApiError::from)?;
        text.push_str(&piece.text);
        if let Some(o) = piece.outcome {
            return Ok((text, *o));
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the answer ended without an outcome"))
}

/// Server-sent events: a chunk per piece of text, a last chunk with `finish_reason` and the
/// tier, the usage chunk when asked for, then `data: [DONE]`. An error after the first event is
/// sent as `data: {"error": ...}` and ends the stream. A client that goes away cancels the
/// answer (the pipeline sees its stream dropped).
fn stream(kind: Kind, id: String, created: u64, model: String, include_usage: bool, mut g: Generation) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(16);
    let served = g.served_from.unwrap_or(ServedFrom::Model);
    let mode = g.cache_mode;
    tokio::spawn(async move {
        let send = |v: serde_json::Value| Event::default().data(v.to_string());
        let first = openai::chunk(kind, &id, created, &model, Some(""), None);
        if tx.send(Ok(send(first))).await.is_err() {
            return;
        }
        loop {
            let piece = tokio::select! {
                _ = tx.closed() => return,
                p = g.chunks.next() => p,
            };
            let piece = match piece {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    let _ = tx.send(Ok(Event::default().data(ApiError::from(e).body().to_string()))).await;
                    return;
                }
                None => {
                    let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "the answer ended without an outcome");
                    let _ = tx.send(Ok(Event::default().data(e.body().to_string()))).await;
                    return;
                }
            };
            if !piece.text.is_empty() && tx.send(Ok(send(openai::chunk(kind, &id, created, &model, Some(&piece.text), None)))).await.is_err() {
                return;
            }
            if let Some(o) = piece.outcome {
                let mut events = vec![send(openai::chunk(kind, &id, created, &model, None, Some(&o)))];
                if include_usage {
                    events.push(send(openai::usage_chunk(kind, &id, created, &o)));
                }
                events.push(Event::default().data("[DONE]"));
                for e in events {
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                return;
            }
        }
    });
    let mut r = Sse::new(ReceiverStream::new(rx)).into_response();
    r.headers_mut().insert(SERVED_FROM_HEADER, header_value(served.as_str()));
    r.headers_mut().insert(CACHE_MODE_HEADER, header_value(mode.as_str()));
    r
}
