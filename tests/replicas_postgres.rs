//! Two `forge-cache serve` processes (replicas) on one PostgreSQL + pgvector: what one computed
//! or learned, the other serves; tenants stay apart; `stats --db postgres://` counts both; a lost
//! database fails requests with UNAVAILABLE and the replica serves again once it is back.

mod common;

use std::path::Path;
use std::process::Command;

use common::postgres::PgServer;
use common::serve::Serve;
use common::*;
use forge_cache::server::client::{Client, ClientError};
use forge_cache::server::proto::{self, ServedFrom};

fn served(o: &proto::Outcome) -> ServedFrom {
    ServedFrom::try_from(o.served_from).expect("served_from")
}

fn stats_json(url: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_forge-cache")).args(["stats", "--json", "--db", url]).output().expect("stats");
    assert!(out.status.success(), "stats failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

fn requests_of(stats: &serde_json::Value, tenant: &str) -> u64 {
    stats.as_array().expect("rows").iter().find(|r| r["tenant"] == tenant).map_or(0, |r| r["requests"].as_u64().expect("requests"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_postgres() {
    let pg = PgServer::start();
    let db = Path::new(&pg.url);
    // Both load their model at the same time.
    let (a, b) = (Serve::spawn_on(db, &[]), Serve::spawn_on(db, &[]));
    let (a, b) = (a.ready(), b.ready());
    let mut ca = Client::connect(&a.grpc_url()).await.expect("connect A");
    let mut cb = Client::connect(&b.grpc_url()).await.expect("connect B");

    // Computed on A, served EXACT by B with nothing computed.
    let first = ca.generate(ask(FRANCE, 24)).await.expect("A computes");
    assert_eq!(served(&first.outcome), ServedFrom::Model);
    let exact = cb.generate(ask(FRANCE, 24)).await.expect("B replays");
    assert_eq!((served(&exact.outcome), exact.outcome.tokens_computed), (ServedFrom::Exact, 0), "{:?}", exact.outcome);
    assert_eq!((exact.text.as_str(), exact.outcome.source_inference_id), (first.text.as_str(), first.outcome.inference_id));

    // A paraphrase on B is checked against A's answer (the draft came from A's row).
    // (SmolLM2-135M answers this spelling as it answered A: the draft is accepted.)
    let para = cb.generate(ask("What is the capital of France ?", 24)).await.expect("paraphrase");
    let o = &para.outcome;
    assert!(matches!(served(o), ServedFrom::Verified | ServedFrom::Partial), "{o:?}");
    assert_eq!(o.source_inference_id, first.outcome.inference_id, "{o:?}");
    assert!(o.draft_tokens_accepted > 0 && o.tokens_computed > 0, "{o:?}");

    // A fact put on A answers on B.
    let put = proto::PutFactRequest { content: "The clinic opens at 9 and closes at 5.".into(), question: "When is the clinic open?".into(), ..Default::default() };
    ca.put_fact(put).await.expect("put on A");
    let fact = cb.generate(ask("When is the clinic open?", 24)).await.expect("fact on B");
    assert_eq!((served(&fact.outcome), fact.text.as_str()), (ServedFrom::Fact, "The clinic opens at 9 and closes at 5."));

    // Tenants stay apart across replicas: another tenant on B gets neither A's answer nor its
    // fact nor a draft from it.
    let mut other = Client::connect(&b.grpc_url()).await.expect("connect").with_tenant("other");
    let o = other.generate(ask(FRANCE, 24)).await.expect("other tenant").outcome;
    assert_eq!((served(&o), o.draft_tokens), (ServedFrom::Model, 0), "{o:?}");
    let o = other.generate(ask("When is the clinic open?", 24)).await.expect("other tenant").outcome;
    assert_ne!(served(&o), ServedFrom::Fact, "{o:?}");

    // `stats --db postgres://` counts every replica's requests.
    let s = stats_json(&pg.url);
    assert_eq!((requests_of(&s, "default"), requests_of(&s, "other"), requests_of(&s, "*")), (4, 2, 6), "{s}");
    // `sql --db postgres://` reads every replica's rows and refuses writes, changing nothing.
    let sql = |q: &str| Command::new(env!("CARGO_BIN_EXE_forge-cache")).args(["sql", "--csv", "--db", &pg.url, q]).output().expect("sql");
    let read = sql("SELECT COUNT(*) AS n FROM inferences");
    assert!(read.status.success(), "{}", String::from_utf8_lossy(&read.stderr));
    assert_eq!(String::from_utf8_lossy(&read.stdout).lines().nth(1), Some("6"));
    let write = sql("DELETE FROM inferences");
    assert!(!write.status.success() && String::from_utf8_lossy(&write.stderr).contains("only reads"), "{}", String::from_utf8_lossy(&write.stderr));
    assert_eq!(requests_of(&stats_json(&pg.url), "*"), 6, "the refused DELETE changed nothing");

    // The database goes away: requests fail with UNAVAILABLE (nothing stale is served, not even
    // the answer A holds in memory); once it is back the same replica serves again.
    pg.pause();
    let err = ca.generate(ask(FRANCE, 24)).await.expect_err("no database, no answer");
    match &err {
        ClientError::Status(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        other => panic!("expected UNAVAILABLE, got {other}"),
    }
    pg.resume();
    let back = ca.generate(ask(FRANCE, 24)).await.expect("reconnected");
    assert_eq!(served(&back.outcome), ServedFrom::Exact);
    assert_eq!(requests_of(&stats_json(&pg.url), "*"), 7, "the refused request was not recorded");
}

/// kill -9 of replica A while 100 requests run on A and B at once (25 questions, Zipf-free
/// round-robin): every answer a client received is a committed row in PostgreSQL; B serves all
/// of its requests; A, restarted, serves EXACT what B computed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_replica_during_100_concurrent_requests() {
    let pg = PgServer::start();
    let db = Path::new(&pg.url);
    let (a, b) = (Serve::spawn_on(db, &["--queue-depth", "128"]), Serve::spawn_on(db, &["--queue-depth", "128"]));
    let (mut a, b) = (a.ready(), b.ready());
    let ca = Client::connect(&a.grpc_url()).await.expect("connect A");
    let cb = Client::connect(&b.grpc_url()).await.expect("connect B");
    let question = |i: usize| format!("What is {} plus {}?", i % 25, i % 25 + 1);

    let (tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..100 {
        let (mut c, tx, q) = (if i % 2 == 0 { ca.clone() } else { cb.clone() }, tx.clone(), question(i));
        tokio::spawn(async move {
            let r = c.generate(ask(&q, 8)).await;
            let _ = tx.send((i, r));
        });
    }
    drop(tx);
    let mut results = Vec::new();
    while let Some(r) = done.recv().await {
        results.push(r);
        if results.len() == 10 {
            a.kill9();
        }
    }
    assert_eq!(results.len(), 100);

    // (The store's client blocks: off the async workers.)
    let (acknowledged, computed_on_b) = tokio::task::block_in_place(|| {
        let ro = forge_cache::store::ReadOnlyStore::open(db).expect("read-only");
        let mut acknowledged = 0;
        let mut computed_on_b = Vec::new();
        for (i, r) in &results {
            match r {
                Ok(g) => {
                    acknowledged += 1;
                    let row = ro.run_read_only(&format!("SELECT response FROM inferences WHERE id = {}", g.outcome.inference_id), 1).expect("row");
                    assert_eq!(row.rows.first().map(|r| r[0].clone()), Some(serde_json::json!(g.text)), "request {i}: answer not in PostgreSQL");
                    if i % 2 == 1 && served(&g.outcome) == ServedFrom::Model {
                        computed_on_b.push(*i);
                    }
                }
                Err(e) => assert_eq!(i % 2, 0, "request {i} on B failed: {e}"),
            }
        }
        (acknowledged, computed_on_b)
    });
    assert!(acknowledged >= 50, "B's 50 at least: {acknowledged}");
    assert!(acknowledged < 100, "the kill came while A still had requests in flight");
    eprintln!("kill -9 during 100 requests: {acknowledged} acknowledged (all in PostgreSQL), {} lost with replica A", 100 - acknowledged);
    assert!(!computed_on_b.is_empty());
    // B keeps serving after A is gone.
    let mut cb2 = cb.clone();
    let after = cb2.generate(ask("What is 100 plus 1?", 8)).await.expect("B after the kill").outcome;
    assert_eq!(served(&after), ServedFrom::Model);

    // A comes back on the same database and replays what B computed.
    let a = Serve::spawn_on(db, &[]).ready();
    let mut ca = Client::connect(&a.grpc_url()).await.expect("connect A again");
    for i in computed_on_b.iter().take(5) {
        let o = ca.generate(ask(&question(*i), 8)).await.expect("A again").outcome;
        assert_eq!((served(&o), o.tokens_computed), (ServedFrom::Exact, 0), "question {i}: {o:?}");
    }
    let replay = ca.generate(ask("What is 100 plus 1?", 8)).await.expect("A again").outcome;
    assert_eq!((served(&replay), replay.source_inference_id), (ServedFrom::Exact, after.inference_id), "B's answer, computed while A was down");
}

/// The first `n` SQuAD dev paragraphs (the Super Bowl 50 article), joined.
fn squad(n: usize) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/squad/squad_v1.1_dev_contexts.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (the tests need ../shared/data)", path.display()));
    let paras: Vec<String> =
        text.lines().take(n).map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["context"].as_str().expect("context").to_string()).collect();
    paras.join("\n\n")
}

fn count(ro: &forge_cache::store::ReadOnlyStore, sql: &str) -> i64 {
    ro.run_read_only(sql, 1).expect("query").rows[0][0].as_i64().expect("a number")
}

/// `--kv-storage blob` on PostgreSQL: the KV blocks of a document that replica A computed are
/// `bytea` rows replica B loads (B computes only the question), and B's answer is token for
/// token its BYPASS answer; a replica with blocks per replica (the default) recomputes the
/// document; two replicas storing the same new blocks at once store each block once and both
/// record their requests (no write lost to the unique block key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_kv_blocks_are_loaded_by_the_other_replica() {
    let pg = PgServer::start();
    let db = Path::new(&pg.url);
    let shared = ["--kv-storage", "blob", "--no-semantic"];
    let (a, b, c) = (Serve::spawn_on(db, &shared), Serve::spawn_on(db, &shared), Serve::spawn_on(db, &["--no-semantic"]));
    let (a, b, c) = (a.ready(), b.ready(), c.ready());
    let mut ca = Client::connect(&a.grpc_url()).await.expect("connect A");
    let mut cb = Client::connect(&b.grpc_url()).await.expect("connect B");
    let mut cc = Client::connect(&c.grpc_url()).await.expect("connect C");
    let doc = squad(1);
    let q = |doc: &str, question: &str| ask(&format!("{doc}\n\nQuestion: {question}"), 8);

    let first = ca.generate(q(&doc, "Which team won Super Bowl 50?")).await.expect("A computes the document");
    assert_eq!((served(&first.outcome), first.outcome.kv_tokens_reused), (ServedFrom::Model, 0), "{:?}", first.outcome);
    let prompt = first.outcome.prompt_token_ids.len();
    assert!(prompt > 100, "a document of {prompt} tokens");

    let on_b = cb.generate(q(&doc, "Where was Super Bowl 50 played?")).await.expect("B");
    let o = &on_b.outcome;
    let ids = &o.prompt_token_ids;
    let shared_prefix = ids.iter().zip(&first.outcome.prompt_token_ids).take_while(|(x, y)| x == y).count();
    eprintln!("B: {} prompt tokens, {shared_prefix} shared with A's, {} reused from A's blocks, ttft {:.0} ms", ids.len(), o.kv_tokens_reused, o.ttft_ms);
    assert_eq!(served(o), ServedFrom::Model, "{o:?}");
    assert!(o.kv_tokens_reused as usize >= shared_prefix / 16 * 16 && o.kv_tokens_reused as usize <= shared_prefix, "{o:?}");
    assert!(shared_prefix > 100);
    let reference = cb.generate(with_mode(q(&doc, "Where was Super Bowl 50 played?"), proto::CacheMode::Bypass)).await.expect("B, BYPASS");
    assert_eq!(reference.outcome.kv_tokens_reused, 0);
    assert_eq!((&on_b.tokens, &on_b.text), (&reference.tokens, &reference.text), "B's answer from A's blocks differs from BYPASS");

    // Blocks per replica (C, the default): nothing of A's is loaded.
    let on_c = cc.generate(q(&doc, "Who was the NFC champion?")).await.expect("C").outcome;
    assert_eq!((served(&on_c), on_c.kv_tokens_reused), (ServedFrom::Model, 0), "{on_c:?}");

    // A and B compute the same new document at once (different questions: no EXACT hit).
    let doc2 = squad(3);
    let (ra, rb) = tokio::join!(ca.generate(q(&doc2, "Who headlined the halftime show?")), cb.generate(q(&doc2, "What was the theme of the game?")));
    let (ra, rb) = (ra.expect("A, second document"), rb.expect("B, second document"));
    tokio::task::block_in_place(|| {
        let ro = forge_cache::store::ReadOnlyStore::open(db).expect("read-only");
        let rows = count(&ro, "SELECT COUNT(*) FROM kv_lineage");
        assert_eq!(rows, count(&ro, "SELECT COUNT(DISTINCT block_key) FROM kv_lineage"));
        assert_eq!(rows, count(&ro, "SELECT COUNT(*) FROM kv_block_data"), "every row has its bytes");
        assert!(rows as usize >= prompt / 16, "{rows} blocks stored");
        // Every request of A and B that could reuse KV recorded its numbers (4); C records none.
        let ids = [first.outcome.inference_id, on_b.outcome.inference_id, ra.outcome.inference_id, rb.outcome.inference_id];
        let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        assert_eq!(count(&ro, &format!("SELECT COUNT(*) FROM kv_requests WHERE inference_id IN ({list})")), 4);
        assert_eq!(count(&ro, "SELECT COUNT(*) FROM kv_requests"), 4);
    });
}
