//! Start-up does only what serving needs, and nothing before the model has loaded (issue 16,
//! findings 6 and 8), with the real model and a real SQLite file: a truncated model fails the
//! start before any file is created (the database used to be created first, empty); the
//! model's full SHA-256 is computed on the first start only and remembered in the store
//! (`model_files`), so a restart does not read the whole model again.

mod common;

use common::{ask, client, scratch, server_config, sql_i64, sql_value, start, FRANCE};
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
