//! Real clients against a real `forge-cache serve` on loopback: the official `openai` Python
//! package and `grpcio` stubs generated from proto/ (through `examples/*.py`, so the examples
//! README shows are what is tested), curl for SSE and `/metrics`, and grpcurl running README's
//! own grpcurl lines. The clients come from `scripts/fetch-test-clients.sh`; without them these
//! tests fail and say so.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::serve::{grpcurl, python, run_ok, Serve};
use serde_json::{json, Value};

fn curl() -> Command {
    let found = Command::new("curl").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "curl is missing: .ci/run installs it (apt-get install curl)");
    let mut c = Command::new("curl");
    c.args(["-sS", "--fail-with-body"]);
    c
}

/// `name{labels} value` lines of the Prometheus text, keyed by `name{labels}`.
fn scrape(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.rsplit_once(' ').and_then(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v))))
        .collect()
}

fn metric(m: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut sorted = labels.to_vec();
    sorted.sort();
    let key = format!("{name}{{{}}}", sorted.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect::<Vec<_>>().join(","));
    m.get(&key).copied().unwrap_or(0.0) as u64
}

#[test]
fn python_clients_curl_and_metrics_against_one_server() {
    let s = Serve::spawn(&[]).ready();
    let base = format!("http://{}/v1", s.http);

    // openai: chat twice (MODEL, then EXACT), a streamed answer, a completion.
    let out = run_ok(python().args(["examples/openai_client.py", "--json", "--base-url", &base]));
    let o: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(o["first"]["served_from"], "MODEL", "{o}");
    assert_eq!(o["again"]["served_from"], "EXACT", "{o}");
    assert_eq!(o["again"]["header_served_from"], "EXACT", "{o}");
    assert_eq!(o["first"]["text"], o["again"]["text"]);
    assert!(o["first"]["text"].as_str().is_some_and(|t| t.contains("Paris")), "{o}");
    let st = &o["stream"];
    let streamed_tokens = st["usage"]["completion_tokens"].as_u64().expect("usage chunk");
    assert!(streamed_tokens >= 16, "{st}");
    assert!(st["chunks"].as_u64().expect("chunks") >= 16, "a streamed answer of {streamed_tokens} tokens came in {} chunks", st["chunks"]);
    assert!(st["span_s"].as_f64().expect("span") > 0.0, "{st}");
    assert_eq!(st["served_from"], "MODEL");
    assert!(!o["completion"]["text"].as_str().unwrap_or_default().is_empty(), "{o}");

    // grpcio (stubs from proto/): the same greedy request as the HTTP one is an EXACT hit with
    // the same text and the same token counts as the HTTP usage; CACHE_MODE_EXACT asks for it.
    let out = run_ok(python().args(["examples/grpc_client.py", "--json", "--server", &s.grpc, "--tenant", "default"]));
    let g: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(g["generate"]["served_from"], "SERVED_FROM_EXACT", "HTTP first, then gRPC: {g}");
    assert_eq!(g["generate"]["text"], o["first"]["text"], "the same greedy request over HTTP and gRPC");
    assert_eq!(g["generate"]["prompt_tokens"], o["first"]["usage"]["prompt_tokens"]);
    assert_eq!(g["generate"]["completion_tokens"], o["first"]["usage"]["completion_tokens"]);
    assert_eq!((g["exact"]["served_from"].as_str(), g["exact"]["tokens_computed"].as_u64()), (Some("SERVED_FROM_EXACT"), Some(0)), "{g}");
    assert_eq!(g["exact"]["text"], o["first"]["text"]);
    assert_eq!(g["fact"]["served_from"], "SERVED_FROM_FACT", "{g}");
    assert_eq!(g["fact"]["text"], "The Seine.");
    assert!(g["search"].as_array().is_some_and(|f| f.iter().any(|x| x["content"] == "The Seine.")), "{g}");
    assert!(g["stats"]["tiers"]["SERVED_FROM_EXACT"].as_u64() >= Some(3), "{g}");

    // curl: SSE from another tenant, ending with [DONE].
    let body = json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 24, "stream": true, "stream_options": {"include_usage": true}});
    let sse = run_ok(curl().args(["-N", "-H", "Content-Type: application/json", "-H", "x-forge-tenant: other", "-d", &body.to_string()]).arg(format!("{base}/chat/completions")));
    let events: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{sse}");
    let parsed: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("JSON event")).collect();
    let finish = parsed.iter().find(|e| e["choices"][0]["finish_reason"].is_string()).expect("a finishing chunk");
    assert_eq!(finish["served_from"], "MODEL");
    let usage = &parsed.last().expect("usage chunk")["usage"];
    let text: String = parsed.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(usage["completion_tokens"].as_u64() > Some(0) && !text.is_empty(), "{sse}");

    // /metrics after this mixed workload (two tenants; MODEL, EXACT, FACT; HTTP and gRPC; a
    // stream; BYPASS) equals `forge-cache stats --json` on the same database.
    let text = run_ok(curl().arg(format!("http://{}/metrics", s.http)));
    let m = scrape(&text);
    let stats_out = run_ok(Command::new(env!("CARGO_BIN_EXE_forge-cache")).args(["stats", "--json", "--db"]).arg(&s.db));
    let stats: Value = serde_json::from_str(stats_out.trim()).expect("stats JSON");
    let mut checked = 0;
    for t in stats.as_array().expect("array").iter().filter(|t| t["tenant"] != "*") {
        let tenant = t["tenant"].as_str().expect("tenant");
        for tier in t["tiers"].as_array().expect("tiers") {
            let from = tier["served_from"].as_str().expect("tier");
            let l = [("tenant", tenant), ("served_from", from)];
            for (name, field) in [
                ("forge_requests_total", "requests"),
                ("forge_tokens_computed_total", "tokens_computed"),
                ("forge_tokens_reused_total", "tokens_reused"),
                ("forge_kv_tokens_reused_total", "kv_tokens_reused"),
            ] {
                assert_eq!(metric(&m, name, &l), tier[field].as_u64().expect("number"), "{name} {l:?} vs stats {field}:\n{text}");
                checked += 1;
            }
        }
        let l = [("tenant", tenant)];
        assert_eq!(metric(&m, "forge_tokens_saved_total", &l), t["tokens_saved"].as_u64().expect("saved"));
        assert_eq!(metric(&m, "forge_kv_prompt_blocks_total", &l), t["kv"]["prompt_blocks"].as_u64().expect("blocks"));
        assert_eq!(metric(&m, "forge_kv_block_hits_total", &[("tenant", tenant), ("tier", "memory")]), t["kv"]["blocks_from_memory"].as_u64().expect("memory"));
        assert_eq!(metric(&m, "forge_kv_block_hits_total", &[("tenant", tenant), ("tier", "disk")]), t["kv"]["blocks_from_disk"].as_u64().expect("disk"));
        let (drafts, accepted) = (t["semantic"]["draft_tokens"].as_u64().unwrap_or(0), t["semantic"]["draft_accepted"].as_u64().unwrap_or(0));
        assert_eq!((metric(&m, "forge_draft_tokens_total", &l), metric(&m, "forge_draft_tokens_accepted_total", &l)), (drafts, accepted));
    }
    assert!(checked >= 2 * 6 * 4, "two tenants' tiers compared ({checked})");
    let requests: u64 = stats.as_array().expect("array").iter().filter(|t| t["tenant"] != "*").map(|t| t["requests"].as_u64().unwrap_or(0)).sum();
    assert_eq!(requests, 8, "every request of the workload was recorded once (4 openai, 3 grpcio, 1 curl)");
    for gauge in ["forge_queue_depth 0", "forge_active_sequences 0"] {
        assert!(text.lines().any(|l| l == gauge), "{gauge}:\n{text}");
    }
    for h in ["forge_time_to_first_token_seconds_count", "forge_request_duration_seconds_count", "forge_stage_seconds_count{stage=\"prefill\"}", "forge_stage_seconds_count{stage=\"lookup\"}", "forge_stage_seconds_count{stage=\"record\"}"] {
        assert!(text.lines().any(|l| l.starts_with(h)), "{h}:\n{text}");
    }
}

/// README's grpcurl lines, run as written (only the address changed) against a real server;
/// grpcurl uses server reflection v1alpha (v1 is checked in tests/service_errors.rs).
#[test]
fn readme_grpcurl_lines_work() {
    let s = Serve::spawn(&[]).ready();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let joined = readme.replace("\\\n", " ");
    let lines: Vec<&str> = joined.lines().map(str::trim).filter(|l| l.starts_with("grpcurl ")).collect();
    assert!(lines.len() >= 4, "README's grpcurl lines: {lines:?}");
    let bin = grpcurl().get_program().to_owned();
    let mut outputs = Vec::new();
    for line in &lines {
        let cmd = line.replacen("grpcurl", &format!("'{}'", bin.to_string_lossy()), 1).replace("127.0.0.1:50051", &s.grpc);
        outputs.push((line.to_string(), run_ok(Command::new("sh").args(["-c", &cmd]))));
    }
    let find = |needle: &str| outputs.iter().find(|(l, _)| l.contains(needle)).map(|(_, o)| o.clone()).unwrap_or_else(|| panic!("no README line with {needle}"));
    assert!(find(" list").contains("forge.v1.Forge"));
    let generate = find("forge.v1.Forge/Generate");
    assert!(generate.contains("Paris"), "the README's Generate example answers sensibly: {generate}");
    assert!(generate.contains("SERVED_FROM_"), "{generate}");
    assert!(find("Health/Check").contains("SERVING"));
}

/// The CLI against the same kind of server: `--server HOST:PORT` without a scheme (generate,
/// health, ab), `ab --make-workload` finding shared/data from another folder, ab's report with
/// its plotters charts; `hardware` without XDG_RUNTIME_DIR prints no `error:` lines.
#[test]
fn cli_server_without_scheme_ab_and_hardware() {
    let bin = env!("CARGO_BIN_EXE_forge-cache");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let work = elsewhere.path().join("w.jsonl");
    run_ok(Command::new(bin).current_dir(elsewhere.path()).args(["ab", "--make-workload", "zipf", "--requests", "4", "--distinct", "2", "--max-tokens", "6", "-o"]).arg(&work));
    assert_eq!(std::fs::read_to_string(&work).expect("workload").lines().count(), 4);
    let missing = Command::new(bin).args(["ab", "--make-workload", "zipf", "--data", "/nonexistent/data", "-o"]).arg(&work).output().expect("run");
    assert!(!missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/data"));

    let s = Serve::spawn(&["--no-semantic"]).ready();
    run_ok(Command::new(bin).args(["health", "--server", &s.grpc]));
    let out = run_ok(Command::new(bin).args(["generate", "--server", &s.grpc, "--system", common::SYSTEM, "--prompt", common::FRANCE, "--max-tokens", "8", "--json"]));
    let g: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(g["served_from"], "MODEL", "{g}");
    let report = elsewhere.path().join("report");
    run_ok(Command::new(bin).args(["ab", "--server", &s.grpc, "--mode", "exact", "--workload"]).arg(&work).arg("--out").arg(&report));
    let svg = std::fs::read_to_string(report.join("latency_cdf.svg")).expect("chart");
    assert!(svg.starts_with("<svg") && svg.contains("polyline"), "{svg}");
    assert!(std::fs::read_to_string(report.join("report.md")).expect("report").contains("EXACT"));

    let hw = Command::new(bin).arg("hardware").env_remove("XDG_RUNTIME_DIR").output().expect("hardware");
    let err = String::from_utf8_lossy(&hw.stderr);
    assert!(hw.status.success() && !err.lines().any(|l| l.starts_with("error")), "{err}");
}
