//! Every bad input gets a clear status and the service stays up; a full queue answers
//! RESOURCE_EXHAUSTED at once; a client that goes away cancels its generation; a corrupt
//! database is refused at start and left untouched; reflection and health answer.

mod common;

use std::time::{Duration, Instant};

use common::{ask, scratch, Scratch, server_config, service, service_with, sql_value, with_mode, FRANCE};
use forge_cache::engine::scheduler::SchedulerConfig;
use forge_cache::server::client::ClientError;
use forge_cache::server::proto::{self, CacheMode, ChatMessage, ServedFrom};
use tonic::Code;

fn status(r: Result<impl std::fmt::Debug, ClientError>) -> tonic::Status {
    match r {
        Err(ClientError::Status(s)) => s,
        other => panic!("expected an error status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_inputs_get_clear_statuses_and_the_server_stays_up() {
    let (_scratch, server, mut c) = service().await;
    let r = |f: &dyn Fn(&mut proto::GenerateRequest)| {
        let mut r = ask(FRANCE, 4);
        f(&mut r);
        r
    };
    let long = "hello ".repeat(9000);
    let cases: Vec<(&str, proto::GenerateRequest, Code, &str)> = vec![
        ("empty prompt", r(&|r| r.prompt.clear()), Code::InvalidArgument, "prompt is empty"),
        ("blank prompt", r(&|r| r.prompt = "  \n ".into()), Code::InvalidArgument, "prompt is empty"),
        ("prompt longer than the context", r(&|r| r.prompt = long.clone()), Code::InvalidArgument, "context is 8192"),
        ("max_tokens 0", r(&|r| r.max_tokens = Some(0)), Code::InvalidArgument, "max_tokens must be at least 1"),
        ("absurd max_tokens", r(&|r| r.max_tokens = Some(4_000_000_000)), Code::InvalidArgument, "exceeds the model's context"),
        ("temperature < 0", r(&|r| r.temperature = Some(-0.5)), Code::InvalidArgument, "temperature"),
        ("temperature NaN", r(&|r| r.temperature = Some(f32::NAN)), Code::InvalidArgument, "temperature"),
        ("top_p 0", r(&|r| r.top_p = Some(0.0)), Code::InvalidArgument, "top_p must be in (0, 1]"),
        ("top_p > 1", r(&|r| r.top_p = Some(1.5)), Code::InvalidArgument, "top_p must be in (0, 1]"),
        ("unknown model", r(&|r| r.model = "gpt-9".into()), Code::NotFound, "unknown model \"gpt-9\""),
        ("unknown cache mode", r(&|r| r.cache_mode = 99), Code::InvalidArgument, "cache_mode"),
        ("prompt and messages", r(&|r| r.messages = vec![ChatMessage { role: "user".into(), content: "hi".into() }]), Code::InvalidArgument, "not both"),
        ("bad role", r(&|r| {
            r.prompt.clear();
            r.system.clear();
            r.messages = vec![ChatMessage { role: "wizard".into(), content: "hi".into() }];
        }), Code::InvalidArgument, "role"),
        ("empty stop string", r(&|r| r.stop = vec![String::new()]), Code::InvalidArgument, "stop"),
        ("tenant field vs header", r(&|r| r.tenant = "other".into()), Code::InvalidArgument, "x-forge-tenant"),
    ];
    let mut c_tenant = c.clone().with_tenant("acme");
    for (name, req, code, text) in cases {
        let result = if name == "tenant field vs header" { c_tenant.generate(req).await } else { c.generate(req).await };
        let s = status(result);
        assert_eq!(s.code(), code, "{name}: {}", s.message());
        assert!(s.message().contains(text), "{name}: message {:?} should mention {text:?}", s.message());
    }
    // The other calls validate too.
    let bad_put = proto::PutFactRequest { content: " ".into(), ..Default::default() };
    assert_eq!(status(c.put_fact(bad_put).await).code(), Code::InvalidArgument);
    let no_reason = proto::InvalidateFactsRequest { ids: vec![1], ..Default::default() };
    assert_eq!(status(c.invalidate_facts(no_reason).await).code(), Code::InvalidArgument);
    let unknown = proto::InvalidateFactsRequest { ids: vec![12345], reason: "x".into(), ..Default::default() };
    assert_eq!(status(c.invalidate_facts(unknown).await).code(), Code::NotFound);

    // Still up, and chat messages work.
    let ok = c.generate(ask(FRANCE, 4)).await.expect("a good request after the bad ones");
    assert_eq!(ok.served_from(), ServedFrom::Model);
    let chat = proto::GenerateRequest {
        messages: vec![ChatMessage { role: "system".into(), content: common::SYSTEM.into() }, ChatMessage { role: "user".into(), content: FRANCE.into() }],
        max_tokens: Some(4),
        ..Default::default()
    };
    let same = c.generate(chat).await.expect("messages");
    assert_eq!((same.served_from(), &same.text), (ServedFrom::Exact, &ok.text), "messages render to the same prompt");

    // Reflection lists the services (what grpcurl asks), health says SERVING.
    let services = reflection_services(&server.url()).await;
    for s in ["forge.v1.Forge", "grpc.health.v1.Health"] {
        assert!(services.iter().any(|x| x == s), "{s} missing from {services:?}");
    }
    forge_cache::server::client::wait_healthy(&server.url(), Duration::from_secs(1)).await.expect("healthy");
    server.stop().await.expect("stop");
}

async fn reflection_services(url: &str) -> Vec<String> {
    use tonic_reflection::pb::v1::{server_reflection_client::ServerReflectionClient, server_reflection_request::MessageRequest};
    use tonic_reflection::pb::v1::{server_reflection_response::MessageResponse, ServerReflectionRequest};
    let channel = tonic::transport::Channel::from_shared(url.to_string()).expect("url").connect().await.expect("connect");
    let mut rc = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
    let mut stream = rc.server_reflection_info(tokio_stream::iter([req])).await.expect("reflection").into_inner();
    let msg = stream.message().await.expect("message").expect("one response");
    match msg.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_decide_the_tenant() {
    let (scratch, server, c) = service_with(|config, s| {
        let tenants = s.dir.path().join("tenants.toml");
        let keys = "[[tenants]]\nname = \"acme\"\napi_keys = [\"acme-secret-1\"]\n\n[[tenants]]\nname = \"globex\"\napi_keys = [\"globex-secret-1\"]\n";
        std::fs::write(&tenants, keys).expect("write");
        config.tenants = Some(tenants);
    })
    .await;
    let s = status(c.clone().generate(ask(FRANCE, 2)).await);
    assert_eq!(s.code(), Code::Unauthenticated, "{}", s.message());
    let s = status(c.clone().with_api_key("not-a-key-at-all").generate(ask(FRANCE, 2)).await);
    assert_eq!((s.code(), s.message()), (Code::Unauthenticated, "unknown API key"));
    let s = status(c.clone().with_api_key("acme-secret-1").with_tenant("globex").get_stats(0).await);
    assert_eq!(s.code(), Code::PermissionDenied, "{}", s.message());
    let g = c.clone().with_api_key("acme-secret-1").generate(ask(FRANCE, 2)).await.expect("a known key works");
    assert_eq!(g.served_from(), ServedFrom::Model);
    let id = g.outcome.inference_id;
    assert_eq!(sql_value(&scratch.db, &format!("SELECT tenant FROM inferences WHERE id = {id}")), "acme");
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_refused_at_once_and_a_closed_stream_cancels() {
    let (scratch, server, mut c) = service_with(|config, _| config.scheduler = SchedulerConfig { queue_depth: 1, max_active: 1, ..SchedulerConfig::default() }).await;
    let db = &scratch.db;

    // A runs (the one active slot), B waits (the one queue slot), C finds the queue full.
    let long = with_mode(ask("Write a long story about a dragon.", 2000), CacheMode::Bypass);
    let mut a = c.generate_stream(long).await.expect("a starts");
    let first = a.message().await.expect("a streams").expect("a token");
    assert_eq!(first.token_ids.len(), 1);
    let b_req = with_mode(ask(FRANCE, 4), CacheMode::Bypass);
    let mut b = c.generate_stream(b_req).await.expect("b is queued");
    let t = Instant::now();
    let s = status(c.generate_stream(with_mode(ask(FRANCE, 4), CacheMode::Bypass)).await);
    assert_eq!(s.code(), Code::ResourceExhausted, "{}", s.message());
    assert!(t.elapsed() < Duration::from_secs(1), "refusal took {:?}", t.elapsed());
    assert!(s.message().contains("queue is full"), "{}", s.message());

    // Closing A's stream cancels it: B gets the slot and finishes.
    drop(a);
    let t = Instant::now();
    let mut b_outcome = None;
    while let Some(m) = b.message().await.expect("b streams") {
        b_outcome = m.outcome.or(b_outcome);
    }
    assert!(b_outcome.is_some(), "b finished");
    assert!(t.elapsed() < Duration::from_secs(30));
    // A is recorded as cancelled, far short of its budget.
    let mut row = serde_json::Value::Null;
    for _ in 0..50 {
        row = sql_value(db, "SELECT json_array(stop_reason, completion_tokens) FROM inferences WHERE stop_reason = 'cancelled'");
        if !row.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let row: serde_json::Value = serde_json::from_str(row.as_str().expect("row")).expect("json");
    assert_eq!(row[0], "cancelled");
    assert!(row[1].as_i64().expect("n") < 2000);
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_database_is_refused_and_left_alone() {
    let Scratch { dir, db } = scratch();
    let junk: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    std::fs::write(&db, &junk).expect("write junk");
    let err = forge_cache::server::start(server_config(&db), "127.0.0.1:0").await.err().expect("must not start");
    let msg = err.to_string();
    assert!(msg.contains("not a usable SQLite database") && msg.contains("left untouched"), "{msg}");
    assert_eq!(std::fs::read(&db).expect("read"), junk, "the file must not be modified");
    assert!(!dir.path().join("forge.db-wal").exists());

    // The CLI says the same and exits non-zero.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_forge-cache"))
        .args(["serve", "--addr", "127.0.0.1:0", "--no-http", "--db"])
        .arg(&db)
        .output()
        .expect("run serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a usable SQLite database"), "{stderr}");
    assert_eq!(std::fs::read(&db).expect("read"), junk);
}
