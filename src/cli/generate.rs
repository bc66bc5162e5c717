//! `forge-cache generate`: answer one prompt and print the text as it is produced, then prefill
//! and decode speed. Offline (the model runs here) unless `--server URL` names a running service,
//! which is then called over gRPC. `--json` prints one object instead:
//! `{prompt_tokens: [ids], tokens: [ids], text, prefill_tok_s, decode_tok_s, stop_reason, ttft_ms}`, and
//! with `--server` also `served_from`, `tokens_computed`, `tokens_reused`, `source_inference_id`,
//! `similarity`, `latency_ms` (round trip seen by the client), `server_latency_ms`, `inference_id`.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::chat::{ChatTemplate, Message};
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::placement::place;
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::tokenizer::{StreamDecoder, Tokenizer};
use forge_cache::engine::Model;
use forge_cache::server::client::Client;
use forge_cache::server::proto;
use forge_cache::vocab::CacheMode;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (a user message with --chat, literal text with --raw).
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template (the default when the model has one).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Tokenize the prompt as given: special tokens parsed, no template.
    #[arg(long)]
    pub raw: bool,
    /// System message for --chat (otherwise the template's default, if any).
    #[arg(long, conflicts_with = "raw")]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Same seed, same text (sampling only).
    #[arg(long)]
    pub seed: Option<u64>,
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long, conflicts_with = "server")]
    pub model: Option<PathBuf>,
    /// CPU threads (default: physical cores).
    #[arg(long, default_value_t = 0, conflicts_with = "server")]
    pub threads: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Call a running service (e.g. http://127.0.0.1:50051) instead of loading the model here.
    #[arg(long)]
    pub server: Option<String>,
    /// Tenant (sent as x-forge-tenant).
    #[arg(long, requires = "server")]
    pub tenant: Option<String>,
    /// API key, for a service started with --tenants (sent as x-forge-api-key). Prefer
    /// --api-key-file or $FORGE_API_KEY: a flag's value is visible to other users in `ps`.
    #[arg(long, requires = "server", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// A file whose first line is the API key (else $FORGE_API_KEY is used when set).
    #[arg(long, requires = "server")]
    pub api_key_file: Option<PathBuf>,
    /// auto: serve from a fact or the exact cache when possible; bypass: compute, touch no
    /// cache; refresh: compute and replace the cached answer.
    #[arg(long, default_value = "auto", value_parser = super::cache_mode_parser())]
    pub cache_mode: CacheMode,
    /// Stop before this string (repeatable; with --server).
    #[arg(long, requires = "server")]
    pub stop: Vec<String>,
    /// A document for the answer to draw on (repeatable, in order; with --server): put at the
    /// start of the user message as its own chunk (--cache-mode blend reuses its KV).
    #[arg(long = "document", requires = "server")]
    pub documents: Vec<String>,
    #[command(flatten)]
    pub backend: super::BackendArgs,
}

#[derive(serde::Serialize)]
struct RemoteJsonOut<'a> {
    #[serde(flatten)]
    base: JsonOut<'a>,
    served_from: &'a str,
    tokens_computed: u32,
    tokens_reused: u32,
    source_inference_id: Option<i64>,
    similarity: Option<f32>,
    latency_ms: f64,
    server_latency_ms: f64,
    inference_id: i64,
    kv_tokens_reused: u32,
    draft_tokens: u32,
    draft_tokens_accepted: u32,
    candidates_tried: u32,
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    prompt_tokens: &'a [u32],
    tokens: &'a [u32],
    text: String,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    stop_reason: forge_cache::vocab::StopReason,
    /// Start to the first token: offline, the prefill; with --server, as the service measured it.
    ttft_ms: f64,
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    if let Some(url) = &a.server {
        if a.backend.backend != super::BackendArg::Cpu || a.backend.tensor_split.is_some() {
            bail!("--backend and --tensor-split choose where the model runs here; a service (--server) has its own");
        }
        return super::runtime()?.block_on(remote(a, url));
    }
    if a.cache_mode != CacheMode::Auto {
        bail!("--cache-mode needs --server (the offline path has no cache)");
    }
    if a.prompt.is_empty() {
        bail!("--prompt is empty");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let sampling = SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.validate()?;
    let path = forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?;
    if !path.exists() {
        bail!(forge_cache::models::missing_hint(&path));
    }
    let backend = Arc::new(CpuBackend::new(a.threads)?);
    let mut model = Model::load_unprepared(&path, backend).with_context(|| format!("loading {}", path.display()))?;
    let placement = place(&mut model, &a.backend.options()?)?;
    // The CPU's copies only of the layers it runs.
    model.prepare_weights();
    eprintln!("forge-cache: layers {placement}");
    let tok = Tokenizer::from_gguf(&model.gguf)?;
    let template = ChatTemplate::from_gguf(&model.gguf)?;

    let text = match (&template, a.raw) {
        (Some(t), false) => {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(Message { role: "system".into(), content: s.clone() });
            }
            msgs.push(Message { role: "user".into(), content: a.prompt.clone() });
            t.render(&msgs, true)?
        }
        (None, false) if a.chat => bail!("{} has no chat template; use --raw", path.display()),
        _ => a.prompt.clone(),
    };
    let prompt = tok.encode_prompt(&text)?;
    let params = GenerateParams { max_tokens: a.max_tokens, sampling, stop_ids: tok.stop_ids().to_vec() };
    let mut state = model.new_state(512);

    let mut stream = StreamDecoder::new(true);
    let mut out = std::io::stdout().lock();
    let gen = generate(&model, &mut state, &prompt, &params, |id| {
        if !a.json {
            // A closed stdout (e.g. `| head`) stops generation instead of panicking.
            let ok = match stream.push(&tok, id) {
                Ok(piece) => out.write_all(piece.as_bytes()).and_then(|_| out.flush()).is_ok(),
                Err(_) => false,
            };
            if !ok {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    let text = tok.decode(&gen.tokens, true)?;
    if a.json {
        let j = JsonOut {
            prompt_tokens: &prompt,
            tokens: &gen.tokens,
            text,
            prefill_tok_s: gen.prefill_tok_s(),
            decode_tok_s: gen.decode_tok_s(),
            stop_reason: gen.stop,
            ttft_ms: gen.prefill_time.as_secs_f64() * 1e3,
        };
        writeln!(out, "{}", serde_json::to_string(&j)?)?;
    } else {
        let _ = writeln!(out, "{}", stream.finish()).and_then(|_| out.flush());
        eprintln!(
            "prompt: {} tokens, {:.1} tokens/s | generated: {} tokens, {:.1} tokens/s | stop: {:?} | {}",
            gen.prompt_tokens,
            gen.prefill_tok_s(),
            gen.tokens.len(),
            gen.decode_tok_s(),
            gen.stop,
            model.placement()
        );
    }
    Ok(())
}

/// Environment variable holding the API key for `generate --server`.
pub const API_KEY_ENV: &str = "FORGE_API_KEY";

/// The API key: --api-key, else the first line of --api-key-file, else $FORGE_API_KEY.
fn api_key(a: &GenerateArgs) -> anyhow::Result<Option<String>> {
    if let Some(k) = &a.api_key {
        return Ok(Some(k.clone()));
    }
    if let Some(path) = &a.api_key_file {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the API key file {}", path.display()))?;
        let key = text.lines().next().unwrap_or_default().trim();
        anyhow::ensure!(!key.is_empty(), "the API key file {} is empty", path.display());
        return Ok(Some(key.to_string()));
    }
    Ok(std::env::var(API_KEY_ENV).ok().map(|k| k.trim().to_string()).filter(|k| !k.is_empty()))
}

/// `generate --server URL`: one Generate call, streamed to stdout (or one JSON object).
async fn remote(a: &GenerateArgs, url: &str) -> anyhow::Result<()> {
    let mut client = Client::connect(url).await?;
    if let Some(t) = &a.tenant {
        client = client.with_tenant(t);
    }
    if let Some(k) = api_key(a)? {
        client = client.with_api_key(k);
    }
    let req = proto::GenerateRequest {
        prompt: a.prompt.clone(),
        system: a.system.clone().unwrap_or_default(),
        raw: a.raw,
        max_tokens: Some(u32::try_from(a.max_tokens).context("--max-tokens is too large")?),
        temperature: Some(a.temperature),
        top_k: u32::try_from(a.top_k).context("--top-k is too large")?,
        top_p: Some(a.top_p),
        seed: a.seed,
        stop: a.stop.clone(),
        cache_mode: proto::CacheMode::from(a.cache_mode) as i32,
        documents: a.documents.clone(),
        ..Default::default()
    };
    let mut out = std::io::stdout().lock();
    let g = client
        .generate_with(req, |piece| {
            if !a.json {
                let _ = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
            }
        })
        .await?;
    let o = &g.outcome;
    // The vocabulary's names (MODEL, EXACT, ...), not the proto's prefixed ones.
    let served_from = proto::ServedFrom::try_from(o.served_from)
        .ok()
        .and_then(|s| forge_cache::vocab::ServedFrom::try_from(s).ok())
        .map_or("UNSPECIFIED", |s| s.as_str());
    let stop = proto::StopReason::try_from(o.stop_reason)
        .ok()
        .and_then(|s| forge_cache::vocab::StopReason::try_from(s).ok())
        .context("the server sent no stop reason")?;
    let decode_steps = (o.tokens_computed as usize).saturating_sub(o.prompt_token_ids.len());
    let rate = |n: usize, ms: f64| if n == 0 || ms <= 0.0 { 0.0 } else { n as f64 / (ms / 1e3) };
    let client_ms = g.client_latency.as_secs_f64() * 1e3;
    if a.json {
        let served = o.served_from != proto::ServedFrom::Model as i32;
        let j = RemoteJsonOut {
            base: JsonOut {
                prompt_tokens: &o.prompt_token_ids,
                tokens: &g.tokens,
                text: g.text.clone(),
                prefill_tok_s: if o.tokens_computed == 0 { 0.0 } else { rate(o.prompt_token_ids.len(), o.prefill_ms) },
                decode_tok_s: rate(decode_steps, o.decode_ms),
                stop_reason: stop,
                ttft_ms: o.ttft_ms,
            },
            served_from,
            tokens_computed: o.tokens_computed,
            tokens_reused: o.tokens_reused,
            source_inference_id: (o.source_inference_id != 0).then_some(o.source_inference_id),
            similarity: served.then_some(o.similarity),
            latency_ms: client_ms,
            server_latency_ms: o.latency_ms,
            inference_id: o.inference_id,
            kv_tokens_reused: o.kv_tokens_reused,
            draft_tokens: o.draft_tokens,
            draft_tokens_accepted: o.draft_tokens_accepted,
            candidates_tried: o.candidates_tried,
        };
        writeln!(out, "{}", serde_json::to_string(&j)?)?;
    } else {
        let _ = writeln!(out).and_then(|_| out.flush());
        let source = match (o.source_inference_id, o.source_fact_id) {
            (0, 0) => String::new(),
            (0, f) => format!(" (fact #{f})"),
            (i, _) => format!(" (inference #{i})"),
        };
        eprintln!(
            "served from {served_from}{source} | prompt: {} tokens | generated: {} tokens | computed {}, reused {} | {:.1} ms round trip, {:.1} ms in the server | stop: {stop:?} | inference #{}",
            o.prompt_token_ids.len(),
            o.completion_tokens,
            o.tokens_computed,
            o.tokens_reused,
            client_ms,
            o.latency_ms,
            o.inference_id
        );
    }
    Ok(())
}
