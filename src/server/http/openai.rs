//! OpenAI's request and response JSON, translated to and from the pipeline's words. Requests are
//! read field by field (not through a derived struct) so a wrong type names its field in the
//! error, and unknown fields are ignored as OpenAI's own API does.
//!
//! Extra fields forge-cache understands: `cache_mode` (`auto`, `bypass`, `refresh`, `verified`,
//! `trust`, `exact`; also the `x-forge-cache-mode` header) and `top_k`. Extra fields in every
//! answer: `served_from` (the tier: `MODEL`, `EXACT`, `FACT`, `VERIFIED`, `PARTIAL`, `TRUST`) and
//! `forge` (the outcome's numbers: inference id, tokens computed and reused, latency, ...).

use serde_json::{json, Map, Value};

use super::error::ApiError;
use crate::pipeline::{ChatMessage, Outcome, Request};
use crate::vocab::{CacheMode, StopReason};

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/chat/completions`: messages through the model's chat template.
    Chat,
    /// `POST /v1/completions`: the prompt as given (no template).
    Completion,
}

/// A parsed request: what the pipeline gets, plus how to answer.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// The request for the pipeline.
    pub request: Request,
    /// Answer as a server-sent event stream (`stream` body field).
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// The `cache_mode` body field, when given.
    pub cache_mode: Option<CacheMode>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::param(param, format!("'{param}' must be {want}, not {}", type_name(got)))
}

/// A field that is absent or null.
fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn opt_bool(o: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    get(o, k).map(|v| v.as_bool().ok_or_else(|| wrong(k, "a boolean", v))).transpose()
}

fn opt_f32(o: &Map<String, Value>, k: &str) -> Result<Option<f32>, ApiError> {
    get(o, k).map(|v| v.as_f64().map(|x| x as f32).ok_or_else(|| wrong(k, "a number", v))).transpose()
}

fn opt_u64(o: &Map<String, Value>, k: &str) -> Result<Option<u64>, ApiError> {
    get(o, k).map(|v| v.as_u64().ok_or_else(|| wrong(k, "a non-negative integer", v))).transpose()
}

fn opt_str<'a>(o: &'a Map<String, Value>, k: &str) -> Result<Option<&'a str>, ApiError> {
    get(o, k).map(|v| v.as_str().ok_or_else(|| wrong(k, "a string", v))).transpose()
}

fn opt_u32(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, ApiError> {
    opt_u64(o, k)?.map(|n| u32::try_from(n).map_err(|_| ApiError::param(k, format!("'{k}' is too large")))).transpose()
}

/// A message's `content`: a string, or a list of `{"type": "text", "text": ...}` parts.
fn content(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => return Err(ApiError::param(param, "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported")),
                }
            }
            Ok(out)
        }
        Some(other) => Err(wrong(param, "a string or a list of text parts", other)),
    }
}

fn messages(v: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v.as_array().ok_or_else(|| wrong("messages", "an array", v))?;
    if list.is_empty() {
        return Err(ApiError::param("messages", "'messages' must hold at least one message"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let param = format!("messages[{i}]");
        let m = m.as_object().ok_or_else(|| wrong(&param, "an object", m))?;
        let role = match get(m, "role") {
            Some(Value::String(r)) => r.as_str(),
            Some(other) => return Err(wrong(&format!("{param}.role"), "a string", other)),
            None => return Err(ApiError::param(&format!("{param}.role"), format!("{param} has no role"))),
        };
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            other => {
                return Err(ApiError::param(
                    &format!("{param}.role"),
                    format!("unsupported role {other:?}: use system (or developer), user or assistant"),
                ))
            }
        };
        out.push(ChatMessage { role: role.to_string(), content: content(get(m, "content"), &format!("{param}.content"))? });
    }
    Ok(out)
}

/// `stop`: a string or a list of strings.
fn stop(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match get(o, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| wrong("stop", "a string or a list of strings", s))).collect(),
        Some(other) => Err(wrong("stop", "a string or a list of strings", other)),
    }
}

/// `documents` (an extension): a list of strings, put at the start of the last user message.
fn documents(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match get(o, "documents") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(|d| d.as_str().map(str::to_string).ok_or_else(|| wrong("documents", "a list of strings", d))).collect(),
        Some(other) => Err(wrong("documents", "a list of strings", other)),
    }
}

/// Reads a request body (already known to be a JSON object).
pub fn parse(kind: Kind, o: &Map<String, Value>) -> Result<Parsed, ApiError> {
    let mut r = Request { model: opt_str(o, "model")?.unwrap_or_default().to_string(), ..Request::default() };
    match kind {
        Kind::Chat => {
            let m = get(o, "messages").ok_or_else(|| ApiError::param("messages", "'messages' is required"))?;
            r.messages = messages(m)?;
        }
        Kind::Completion => {
            r.raw = true;
            r.prompt = match get(o, "prompt") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
                Some(Value::Array(_)) => return Err(ApiError::param("prompt", "'prompt' must be one string (lists of prompts or of token ids are not supported)")),
                Some(other) => return Err(wrong("prompt", "a string", other)),
                None => return Err(ApiError::param("prompt", "'prompt' is required")),
            };
            if opt_bool(o, "echo")? == Some(true) {
                return Err(ApiError::param("echo", "'echo' is not supported"));
            }
            if get(o, "suffix").is_some() {
                return Err(ApiError::param("suffix", "'suffix' is not supported"));
            }
            if opt_u64(o, "best_of")?.is_some_and(|b| b != 1) {
                return Err(ApiError::param("best_of", "'best_of' must be 1"));
            }
        }
    }
    if let Some(n) = get(o, "n") {
        match n.as_u64() {
            Some(1) => {}
            Some(k) => return Err(ApiError::param("n", format!("'n' must be 1 (one answer per request), not {k}"))),
            None => return Err(wrong("n", "the integer 1", n)),
        }
    }
    if get(o, "logprobs").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::param("logprobs", "'logprobs' is not supported"));
    }
    // max_completion_tokens is OpenAI's current name; max_tokens the older one.
    r.max_tokens = match opt_u32(o, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => opt_u32(o, "max_tokens")?,
    };
    r.temperature = opt_f32(o, "temperature")?;
    r.top_p = opt_f32(o, "top_p")?;
    r.top_k = opt_u32(o, "top_k")?.unwrap_or(0);
    r.seed = match get(o, "seed") {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| wrong("seed", "a non-negative integer", v))?),
    };
    r.stop = stop(o)?;
    r.documents = documents(o)?;
    opt_str(o, "user")?;
    let stream = opt_bool(o, "stream")?.unwrap_or(false);
    let include_usage = match get(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")?.unwrap_or(false),
        Some(other) => return Err(wrong("stream_options", "an object", other)),
    };
    let cache_mode = match opt_str(o, "cache_mode")? {
        None => None,
        Some(s) => Some(parse_cache_mode(s).map_err(|m| ApiError::param("cache_mode", m))?),
    };
    Ok(Parsed { request: r, stream, include_usage, cache_mode })
}

pub fn parse_cache_mode(s: &str) -> Result<CacheMode, String> {
    CacheMode::parse(s).ok_or_else(|| format!("unknown cache mode {s:?}: use auto, bypass, refresh, verified, trust, exact, equivalent or blend"))
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(s: StopReason) -> &'static str {
    match s {
        StopReason::Stop | StopReason::Cancelled => "stop",
        StopReason::Length | StopReason::ContextFull => "length",
    }
}

/// `usage`, with the prompt tokens no cache recomputed as `cached_tokens` and accepted draft
/// tokens as `accepted_prediction_tokens` (OpenAI's names for predicted outputs).
pub fn usage(o: &Outcome) -> Value {
    let prompt = o.prompt_token_ids.len();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": o.completion_tokens,
        "total_tokens": prompt + o.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": o.cached_prompt_tokens() },
        "completion_tokens_details": {
            "accepted_prediction_tokens": o.draft_tokens_accepted,
            "rejected_prediction_tokens": o.draft_tokens - o.draft_tokens_accepted,
        },
    })
}

/// The `forge` object: where the answer came from and what it cost.
pub fn forge(o: &Outcome) -> Value {
    json!({
        "served_from": o.served_from.as_str(),
        "cache_mode": o.cache_mode.as_str(),
        "inference_id": o.inference_id,
        "source_inference_id": o.source_inference_id,
        "source_fact_id": o.source_fact_id,
        "similarity": o.similarity,
        "tokens_computed": o.tokens_computed,
        "tokens_reused": o.tokens_reused,
        "kv_tokens_reused": o.kv_tokens_reused,
        "blend_tokens_reused": o.blend_tokens_reused,
        "blend_tokens_recomputed": o.blend_tokens_recomputed,
        "draft_tokens": o.draft_tokens,
        "draft_tokens_accepted": o.draft_tokens_accepted,
        "equivalence": o.equivalence.map(|e| json!({"mean_margin": e.mean_margin, "worst_margin": e.worst_margin})),
        "equivalence_checks": o.equivalence_checks,
        "ttft_ms": o.ttft_ms,
        "latency_ms": o.latency_ms,
        "stop_reason": o.stop_reason.as_str(),
        "backend": o.backend,
    })
}

/// The whole answer of a request that did not stream.
pub fn completion(kind: Kind, id: &str, created: u64, text: &str, o: &Outcome) -> Value {
    let choice = match kind {
        Kind::Chat => json!({
            "index": 0,
            "message": { "role": "assistant", "content": text, "refusal": null },
            "logprobs": null,
            "finish_reason": finish_reason(o.stop_reason),
        }),
        Kind::Completion => json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(o.stop_reason) }),
    };
    json!({
        "id": id,
        "object": if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": created,
        "model": o.model,
        "system_fingerprint": null,
        "choices": [choice],
        "usage": usage(o),
        "served_from": o.served_from.as_str(),
        "forge": forge(o),
    })
}

/// One streamed chunk: a text delta, or (with `finish`) the end of the choice.
pub fn chunk(kind: Kind, id: &str, created: u64, model: &str, delta: Option<&str>, finish: Option<&Outcome>) -> Value {
    let finish_reason = finish.map(|o| finish_reason(o.stop_reason));
    let choice = match kind {
        Kind::Chat => {
            let delta = match delta {
                Some(t) => json!({ "role": "assistant", "content": t }),
                None => json!({}),
            };
            json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason })
        }
        Kind::Completion => json!({ "index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish_reason }),
    };
    let mut v = json!({
        "id": id,
        "object": if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": [choice],
    });
    if let Some(o) = finish {
        v["served_from"] = json!(o.served_from.as_str());
        v["forge"] = forge(o);
    }
    v
}

/// The usage chunk after the last choice chunk (`stream_options.include_usage`).
pub fn usage_chunk(kind: Kind, id: &str, created: u64, o: &Outcome) -> Value {
    json!({
        "id": id,
        "object": if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
        "created": created,
        "model": o.model,
        "system_fingerprint": null,
        "choices": [],
        "usage": usage(o),
        "served_from": o.served_from.as_str(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().expect("object").clone()
    }

    #[test]
    fn chat_requests() {
        let p = parse(
            Kind::Chat,
            &obj(json!({
                "model": "m", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                "max_tokens": 9, "max_completion_tokens": 7, "temperature": 0, "stop": "\n", "n": 1, "user": "u1",
                "stream": true, "stream_options": {"include_usage": true}, "cache_mode": "EXACT", "frequency_penalty": 0.5, "whatever": [1],
                "documents": ["Doc one.", "Doc two."]
            })),
        )
        .expect("valid");
        assert_eq!(p.request.messages, vec![ChatMessage { role: "system".into(), content: "Be brief.".into() }, ChatMessage { role: "user".into(), content: "Hi".into() }]);
        assert_eq!((p.request.max_tokens, p.request.stop.clone(), p.stream, p.include_usage, p.cache_mode), (Some(7), vec!["\n".to_string()], true, true, Some(CacheMode::Exact)));
        assert_eq!(p.request.documents, vec!["Doc one.".to_string(), "Doc two.".to_string()]);
        let blend = parse(Kind::Chat, &obj(json!({"messages": [{"role": "user", "content": "Hi"}], "cache_mode": "blend"}))).expect("blend");
        assert_eq!((blend.cache_mode, blend.request.documents.len()), (Some(CacheMode::Blend), 0));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let cases = [
            (json!({"messages": []}), "messages"),
            (json!({"messages": "hi"}), "messages"),
            (json!({}), "messages"),
            (json!({"messages": [{"role": "tool", "content": "x"}]}), "messages[0].role"),
            (json!({"messages": [{"role": "user", "content": "x"}], "n": 2}), "n"),
            (json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), "temperature"),
            (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}), "max_tokens"),
            (json!({"messages": [{"role": "user", "content": "x"}], "stop": [1]}), "stop"),
            (json!({"messages": [{"role": "user", "content": "x"}], "cache_mode": "sometimes"}), "cache_mode"),
            (json!({"messages": [{"role": "user", "content": 5}]}), "messages[0].content"),
            (json!({"messages": [{"role": "user", "content": "x"}], "documents": "one"}), "documents"),
            (json!({"messages": [{"role": "user", "content": "x"}], "documents": ["a", 2]}), "documents"),
        ];
        for (body, param) in cases {
            let e = parse(Kind::Chat, &obj(body.clone())).expect_err("must fail");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
        let e = parse(Kind::Completion, &obj(json!({"prompt": [1, 2]}))).expect_err("token ids");
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
