//! The OpenAI-compatible HTTP API of a real `forge-cache serve` (subprocess, loopback), over
//! raw HTTP/1.1: `/health` is 503 while the model loads and 200 after; every bad input gets a
//! 4xx in OpenAI's error shape, the server stays up, and nothing is recorded as served; API keys
//! from the same tenants file as gRPC; the headers and body fields that say which tier served.

mod common;

use std::time::{Duration, Instant};

use common::serve::{get, http, post_json, Serve};
use serde_json::json;

const KEY: &str = "acme-key-0001";

fn chat_body(content: &str) -> serde_json::Value {
    json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "system", "content": common::SYSTEM}, {"role": "user", "content": content}], "max_tokens": 8, "temperature": 0})
}

#[test]
fn health_while_loading_bad_inputs_and_api_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants = dir.path().join("tenants.toml");
    std::fs::write(&tenants, format!("[[tenants]]\nname = \"acme\"\napi_keys = [\"{KEY}\"]\n")).expect("tenants file");
    let db = dir.path().join("forge.db");
    let mut s = Serve::spawn_on(&db, &["--tenants", tenants.to_str().expect("utf-8 path")]);

    // The listener is up before the model: 503 first, then 200.
    let mut statuses = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = get(&s.http, "/health");
        statuses.push(r.status);
        if r.status == 200 {
            assert_eq!(r.json()["status"], "ok");
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json()["status"], "loading");
        assert!(Instant::now() < deadline, "never became healthy");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(statuses[0], 503, "the first /health answer comes while the model loads: {statuses:?}");
    let s_ready = s.wait_for_line(" serving", Duration::from_secs(60));
    assert!(s_ready.is_some());

    let auth = ("Authorization", "Bearer acme-key-0001");
    let big = vec![b'a'; 10 << 20];
    let mut bad_utf8 = br#"{"messages": [{"role": "user", "content": ""#.to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xfe, b'"', b'}', b']', b'}']);
    let cases: Vec<(&str, u16, common::serve::Resp)> = vec![
        ("invalid JSON", 400, http(&s.http, "POST", "/v1/chat/completions", &[auth], b"{\"messages\": [")),
        ("not an object", 400, http(&s.http, "POST", "/v1/chat/completions", &[auth], b"[1, 2]")),
        ("wrong type", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}))),
        ("wrong type: messages", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": {"role": "user"}}))),
        ("empty messages", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": []}))),
        ("only empty content", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": [{"role": "user", "content": "  "}]}))),
        ("unknown role", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": [{"role": "wizard", "content": "Hi"}]}))),
        ("n = 2", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": [{"role": "user", "content": "Hi"}], "n": 2}))),
        ("temperature < 0", 400, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"messages": [{"role": "user", "content": "Hi"}], "temperature": -1}))),
        ("unknown cache mode", 400, post_json(&s.http, "/v1/chat/completions", &[auth, ("x-forge-cache-mode", "sometimes")], &chat_body("Hi"))),
        ("10 MB body", 413, http(&s.http, "POST", "/v1/chat/completions", &[auth, ("Expect", "100-continue")], &big)),
        ("invalid UTF-8", 400, http(&s.http, "POST", "/v1/chat/completions", &[auth], &bad_utf8)),
        ("missing API key", 401, post_json(&s.http, "/v1/chat/completions", &[], &chat_body("Hi"))),
        ("wrong API key", 401, post_json(&s.http, "/v1/chat/completions", &[("Authorization", "Bearer nope-nope-nope")], &chat_body("Hi"))),
        ("another tenant", 403, post_json(&s.http, "/v1/chat/completions", &[auth, ("x-forge-tenant", "globex")], &chat_body("Hi"))),
        ("unknown model", 404, post_json(&s.http, "/v1/chat/completions", &[auth], &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "Hi"}]}))),
        ("completions: token ids", 400, post_json(&s.http, "/v1/completions", &[auth], &json!({"prompt": [1, 2, 3]}))),
        ("models without a key", 401, get(&s.http, "/v1/models")),
        ("no such route", 404, get(&s.http, "/v1/embeddings")),
    ];
    for (what, status, r) in &cases {
        assert_eq!(r.status, *status, "{what}: {}", r.text());
        let e = r.json();
        assert!(e["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {e}");
        assert!(e["error"]["type"].is_string() && e["error"].get("param").is_some() && e["error"].get("code").is_some(), "{what}: {e}");
    }
    assert_eq!(cases.iter().find(|c| c.0 == "n = 2").map(|c| c.2.json()["error"]["param"].clone()), Some(json!("n")));
    assert_eq!(cases.iter().find(|c| c.0 == "wrong API key").map(|c| c.2.json()["error"]["code"].clone()), Some(json!("invalid_api_key")));

    // Still up, nothing recorded as served; the refusals are counted.
    assert!(s.alive());
    assert_eq!(get(&s.http, "/health").status, 200);
    assert_eq!(common::sql_i64(&db, "SELECT count(*) FROM inferences"), 0);
    let metrics = get(&s.http, "/metrics").text();
    assert!(!metrics.contains("forge_requests_total{"), "no request counted as served:\n{metrics}");
    assert!(metrics.lines().any(|l| l.starts_with("forge_requests_rejected_total{code=\"invalid_argument\"}")), "{metrics}");

    // A good request with the key: the model, then the exact cache, said by header and body.
    let first = post_json(&s.http, "/v1/chat/completions", &[auth], &chat_body("What is the capital of France?"));
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-forge-served-from"), Some("MODEL"));
    assert_eq!(first.header("x-forge-cache-mode"), Some("auto"));
    let again = post_json(&s.http, "/v1/chat/completions", &[auth], &chat_body("What is the capital of France?"));
    let (a, b) = (first.json(), again.json());
    assert_eq!(again.header("x-forge-served-from"), Some("EXACT"));
    assert_eq!((b["served_from"].as_str(), b["forge"]["tokens_computed"].as_u64()), (Some("EXACT"), Some(0)));
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], b["usage"]["prompt_tokens"]);
    assert_eq!(common::sql_i64(&db, "SELECT count(*) FROM inferences WHERE tenant = 'acme'"), 2);
    // BYPASS by header: computed again, nothing read from the cache.
    let bypass = post_json(&s.http, "/v1/chat/completions", &[auth, ("x-forge-cache-mode", "bypass")], &chat_body("What is the capital of France?"));
    assert_eq!(bypass.header("x-forge-served-from"), Some("MODEL"));
    assert_eq!(bypass.json()["forge"]["cache_mode"], "bypass");
}
