//! Damaged stores are refused at start and left byte for byte as they were (issue 16,
//! finding 2), with the real model and a real SQLite file: a database with one 4 KiB page of
//! random bytes in the middle (its header is fine, so a first read succeeds: before the check
//! the service started, served and wrote to it), and a KV side file whose index (the
//! `kv_lineage` rows) holds a slot number that cannot be.

mod common;

use std::path::Path;

use common::{ask, client, scratch, server_config, start, FRANCE};
use forge_cache::server::{self, LoadError, ServerError};
use rusqlite::{Connection, OpenFlags};

/// `PRAGMA integrity_check` of `db` through an immutable read-only connection (writes nothing,
/// creates no file beside it).
fn integrity(db: &Path) -> String {
    let uri = format!("file:{}?immutable=1", db.display());
    let conn = Connection::open_with_flags(uri, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI).expect("open");
    let rows: Result<Vec<String>, _> = conn.prepare("PRAGMA integrity_check").and_then(|mut st| st.query_map([], |r| r.get(0))?.collect());
    match rows {
        Ok(r) => r.join("; "),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_with_a_damaged_page_is_refused_and_left_byte_identical() {
    let s = scratch();
    // A store with a few hundred pages of requests.
    drop(forge_cache::store::Store::open(&s.db).expect("create"));
    {
        let conn = Connection::open(&s.db).expect("conn");
        conn.execute_batch(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
             INSERT INTO inferences (tenant, prompt, prompt_hash, model, model_id, params, cache_mode, served_from,
                 prompt_tokens, completion_tokens, tokens_computed, tokens_reused, stop_reason, response,
                 response_tokens, latency_ms, backend)
             SELECT 't', 'question ' || i || ' ' || hex(randomblob(120)), hex(randomblob(32)), 'm', 'id', '{}', 'auto', 'MODEL',
                 3, 1, 4, 0, 'stop', 'answer ' || hex(randomblob(100)), '[1]', 2.0, 'cpu' FROM n;",
        )
        .expect("rows");
    }
    assert_eq!(integrity(&s.db), "ok");
    let mut bytes = std::fs::read(&s.db).expect("read");
    let pages = bytes.len() / 4096;
    assert!(pages > 100, "{pages} pages");
    // Page pages/2 (a table page of `inferences`): 4 KiB of random bytes.
    let mut seed = 0x9e3779b97f4a7c15u64;
    for b in &mut bytes[(pages / 2) * 4096..(pages / 2 + 1) * 4096] {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
    std::fs::write(&s.db, &bytes).expect("damage");
    let report = integrity(&s.db);
    assert_ne!(report, "ok", "the damage is real");

    let err = server::start(server_config(&s.db), "127.0.0.1:0").await.err().expect("a damaged database must be refused");
    let msg = err.to_string();
    assert!(matches!(err, ServerError::Load(LoadError::Store(_))), "{msg}");
    assert!(msg.contains("damaged") && msg.contains("nothing was changed"), "{msg}");
    assert_eq!(std::fs::read(&s.db).expect("read"), bytes, "the database must be left byte for byte");
    assert_eq!(integrity(&s.db), report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_side_file_with_a_damaged_index_is_refused_and_left_byte_identical() {
    let s = scratch();
    let server = start(server_config(&s.db)).await;
    let mut c = client(&server).await;
    let question = format!("{FRANCE} {}", "Answer briefly, in one word, and do not explain anything else. ".repeat(3));
    c.generate(ask(&question, 4)).await.expect("generate");
    server.stop().await.expect("stop");
    let side = s.db.with_file_name("forge.db.kv");
    {
        let conn = Connection::open(&s.db).expect("conn");
        let n: i64 = conn.query_row("SELECT COUNT(*) FROM kv_lineage WHERE storage = 'file'", [], |r| r.get(0)).expect("count");
        assert!(n >= 2, "the request stored its prompt's blocks ({n})");
        // A slot number with its sign bit flipped (the record itself stays well-formed).
        conn.execute("UPDATE kv_lineage SET slot = -1 - slot WHERE id = (SELECT MAX(id) FROM kv_lineage)", []).expect("damage the index");
    }
    let (db_bytes, side_bytes) = (std::fs::read(&s.db).expect("db"), std::fs::read(&side).expect("side file"));

    let err = server::start(server_config(&s.db), "127.0.0.1:0").await.err().expect("a damaged KV index must be refused");
    let msg = err.to_string();
    assert!(matches!(err, ServerError::Load(LoadError::Kv(_))), "{msg}");
    assert!(msg.contains("negative slot") && msg.contains("nothing was changed"), "{msg}");
    assert_eq!(std::fs::read(&s.db).expect("db"), db_bytes, "the database must be left byte for byte");
    assert_eq!(std::fs::read(&side).expect("side"), side_bytes, "the side file must be left byte for byte");

    // The remedy the message names: one start without a disk budget drops the stored blocks.
    let mut config = server_config(&s.db);
    config.kv.as_mut().expect("kv reuse on").disk_bytes = 0;
    start(config).await.stop().await.expect("stop");
    let server = start(server_config(&s.db)).await;
    let g = client(&server).await.generate(ask(FRANCE, 5)).await.expect("generate");
    assert_eq!(g.outcome.kv_tokens_reused, 0, "nothing stored survived");
    server.stop().await.expect("stop");
}
