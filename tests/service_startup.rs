//! Start-up does only what serving needs, and nothing before the model has loaded (issue 16,
//! findings 6 and 8), with the real model and a real SQLite file: a truncated model fails the
//! start before any file is created (the database used to be created first, empty); the
//! model's full SHA-256 is computed on the first start only and remembered in the store
//! (`model_files`), so a restart does not read the whole model again. A restarted `serve`
//! answers an EXACT hit without the model's tokenizer (which it builds in the background).

mod common;

use std::time::Duration;

use common::serve::{get, Serve};
use common::{ask, client, scratch, server_config, sql_i64, sql_value, start, FRANCE};
use forge_cache::server::client::{Client, Generated};
use forge_cache::server::proto::ServedFrom;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_model_fails_the_start_before_any_file_is_created() {
    let s = scratch();
    let model = s.dir.path().join("truncated.gguf");
    let bytes = std::fs::read(common::smollm2_path()).expect("model");
    std::fs::write(&model, &bytes[..bytes.len() / 3]).expect("write");
    let mut config = server_config(&s.db);
    config.model = model;
    let err = forge_cache::server::start(config, "127.0.0.1:0").await.err().expect("a truncated model must fail the start");
    assert!(err.to_string().contains("truncated.gguf"), "{err}");
    let left: Vec<_> = std::fs::read_dir(s.dir.path()).expect("dir").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(left, ["truncated.gguf"], "no file may be created before the model has loaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_hash_is_computed_once_and_remembered() {
    let s = scratch();
    let server = start(server_config(&s.db)).await;
    let first_id = server.model_id.clone();
    let mut c = client(&server).await;
    let answer = c.generate(ask(FRANCE, 4)).await.expect("generate");
    server.stop().await.expect("stop");
    assert_eq!(first_id, forge_cache::store::sha256_file(&common::smollm2_path()).expect("hash"));
    assert_eq!(sql_i64(&s.db, "SELECT COUNT(*) FROM model_files"), 1);
    assert_eq!(sql_value(&s.db, "SELECT sha256 FROM model_files"), first_id.as_str());
    let hashed_at = sql_value(&s.db, "SELECT hashed_at FROM model_files");

    let server = start(server_config(&s.db)).await;
    assert_eq!(server.model_id, first_id, "the same identity: every cache key stays valid");
    let hit = client(&server).await.generate(ask(FRANCE, 4)).await.expect("generate");
    assert_eq!((hit.served_from(), hit.text), (ServedFrom::Exact, answer.text));
    server.stop().await.expect("stop");
    assert_eq!(sql_i64(&s.db, "SELECT COUNT(*) FROM model_files"), 1);
    assert_eq!(sql_value(&s.db, "SELECT hashed_at FROM model_files"), hashed_at, "not hashed again");
}

/// `forge_stage_seconds_count{stage="STAGE"}` on the service's /metrics (0 when never observed).
fn stage_count(serve: &Serve, stage: &str) -> u64 {
    let text = get(&serve.http, "/metrics").text();
    let series = format!("forge_stage_seconds_count{{stage=\"{stage}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(series.as_str())).map_or(0, |v| v.trim().parse().expect("a count"))
}

/// One question to a restarted `serve` on `db` (semantic tier off: the embedder is not what is
/// tested); returns the answer, the request's log line and the stage counts of `tokenize` and
/// `tokenizer_wait` after it.
async fn ask_restarted(db: &std::path::Path, question: &str) -> (Generated, String, u64, u64) {
    let mut serve = Serve::spawn_on(db, &["--no-semantic"]).ready();
    let mut c = Client::connect(&serve.grpc_url()).await.expect("connect");
    let answer = c.generate(ask(question, 4)).await.expect("generate");
    let line = serve.wait_for_line("served_from=", Duration::from_secs(10)).expect("the request's log line");
    let (tokenize, wait) = (stage_count(&serve, "tokenize"), stage_count(&serve, "tokenizer_wait"));
    (answer, line, tokenize, wait)
}

/// Issue 16: a restarted service answers an EXACT hit from the store by the prompt's text, the
/// prompt's token ids read back from the answer's row: the hit never asks for the tokenizer
/// (built on its own thread at start-up), so it cannot wait for it — its request line says
/// `tokenized=false`, /metrics has no `tokenize` or `tokenizer_wait` observation — and its
/// outcome carries the same prompt ids as the answer it replays. A miss tokenizes. A row written
/// before the ids were kept (NULL, as after migrating an older store) is still a hit, tokenized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_service_answers_an_exact_hit_without_the_tokenizer() {
    let s = scratch();
    let (first, line, tokenize, _) = ask_restarted(&s.db, FRANCE).await;
    assert_eq!(first.served_from(), ServedFrom::Model);
    assert!(line.contains("tokenized=true") && tokenize == 1, "a computed answer tokenizes its prompt: {line} ({tokenize})");
    let ids = first.outcome.prompt_token_ids.clone();
    assert!(ids.len() > 10, "{ids:?}");

    let (hit, line, tokenize, wait) = ask_restarted(&s.db, FRANCE).await;
    assert_eq!((hit.served_from(), &hit.text), (ServedFrom::Exact, &first.text));
    assert!(line.contains("served_from=EXACT") && line.contains("tokenized=false"), "{line}");
    assert_eq!((tokenize, wait), (0, 0), "the EXACT hit neither tokenized nor waited for the tokenizer");
    assert_eq!(hit.outcome.prompt_token_ids, ids, "the hit's outcome carries the prompt's ids");
    assert_eq!(hit.outcome.completion_tokens, first.outcome.completion_tokens);

    // A row from before the ids were kept: still a hit, with the same ids, tokenized.
    let conn = rusqlite::Connection::open(&s.db).expect("open");
    assert_eq!(conn.execute("UPDATE inferences SET prompt_token_ids = NULL WHERE prompt_token_ids IS NOT NULL", []).expect("update"), 1, "only the computed answer keeps its prompt ids");
    drop(conn);
    let (old, line, tokenize, _) = ask_restarted(&s.db, FRANCE).await;
    assert_eq!((old.served_from(), &old.text, &old.outcome.prompt_token_ids), (ServedFrom::Exact, &first.text, &ids));
    assert!(line.contains("tokenized=true") && tokenize == 1, "{line} ({tokenize})");

    // A miss after a restart tokenizes (waiting for the tokenizer if it is still being built).
    let (miss, line, tokenize, _) = ask_restarted(&s.db, "Name a primary color.").await;
    assert_eq!(miss.served_from(), ServedFrom::Model);
    assert!(line.contains("tokenized=true") && tokenize == 1, "{line} ({tokenize})");
}
