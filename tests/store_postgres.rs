//! The PostgreSQL store against a real PostgreSQL 16 + pgvector (scripts/pg-test-server.sh):
//! the same schema as SQLite's, the same answers from the same calls, tenant isolation, real
//! concurrent writers from two stores (two "replicas"), the read-only `sql` path, and a lost
//! connection (UNAVAILABLE, then reconnecting). No model needed: seconds.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use common::postgres::PgServer;
use forge_cache::store::semantic::{EquivalenceObservation, Outcome};
use forge_cache::store::{NewInference, PgStore, ReadOnlyStore, SqliteStore, Store, StoreError};
use forge_cache::vocab::{CacheMode, ServedFrom, StopReason};

fn sample<'a>(tenant: &'a str, key: Option<&'a str>, served_from: ServedFrom, mode: CacheMode) -> NewInference<'a> {
    NewInference {
        tenant,
        question: Some("What is the capital of France?"),
        prompt: "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n",
        prompt_hash: "ph",
        model: "m",
        model_id: "mid",
        params: "{\"max_tokens\": 40}",
        cache_mode: mode,
        cache_key: key,
        served_from,
        source_inference_id: None,
        source_fact_id: None,
        similarity: None,
        prompt_tokens: 10,
        completion_tokens: 3,
        tokens_computed: 12,
        tokens_reused: 0,
        stop_reason: StopReason::Stop,
        response: "The capital of France is Paris.",
        response_tokens: &[1, 2, 3],
        prompt_token_ids: Some(&[7, 8, 9]),
        queue_ms: 0.0,
        prefill_ms: 1.0,
        decode_ms: 2.0,
        latency_ms: 3.5,
        backend: "test",
        ttft_ms: Some(1.5),
        kv_tokens_reused: 0,
        draft_tokens: 0,
        draft_accepted: 0,
        candidates_tried: 0,
        response_logprobs: Some(&[-0.5, -0.25, -1.0]),
        equivalence_mean: None,
        equivalence_worst: None,
        equivalence_checks: 0,
    }
}

fn unit(hot: &[(usize, f32)]) -> Vec<f32> {
    let mut v = vec![0f32; 384];
    for &(i, x) in hot {
        v[i] = x;
    }
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

/// (table or view, column) pairs of the forge-cache schema on each backend.
fn sqlite_columns(path: &std::path::Path) -> BTreeSet<(String, String)> {
    let conn = forge_cache::store::query::open_read_only(path).expect("open");
    let names = forge_cache::store::query::run_read_only(
        &conn,
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%'
           AND name NOT LIKE 'prompt_vectors_%' AND name NOT LIKE 'fact_vectors_%'",
        1000,
    )
    .expect("tables");
    let mut out = BTreeSet::new();
    for row in names.rows {
        let t = row[0].as_str().expect("name").to_string();
        let cols = forge_cache::store::query::run_read_only(&conn, &format!("SELECT name FROM pragma_table_info('{t}')"), 1000).expect("cols");
        // vec0 tables show their implicit `rowid`; PostgreSQL tables have none.
        for c in cols.rows.iter().filter(|c| c[0] != "rowid") {
            out.insert((t.clone(), c[0].as_str().expect("col").to_string()));
        }
    }
    out
}

fn pg_columns(url: &str) -> BTreeSet<(String, String)> {
    let ro = ReadOnlyStore::open(std::path::Path::new(url)).expect("read-only");
    let r = ro
        .run_read_only(
            "SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = 'public' AND table_name != 'forge_schema_migrations'",
            100_000,
        )
        .expect("columns");
    r.rows.iter().map(|row| (row[0].as_str().expect("t").to_string(), row[1].as_str().expect("c").to_string())).collect()
}

#[test]
fn one_schema_same_answers_tenants_apart_and_sql_only_reads() {
    let pg = PgServer::start();
    let store = Store::open_db(std::path::Path::new(&pg.url)).expect("open the PostgreSQL store");
    assert!(store.sqlite().is_none());
    assert_eq!(store.schema_version().expect("version"), forge_cache::store::MIGRATIONS.len() as i64);
    // Opening again (another replica starting) migrates nothing twice.
    let again = PgStore::open(&pg.url).expect("second open");
    assert_eq!(again.schema_version().expect("version"), forge_cache::store::MIGRATIONS.len() as i64);

    // The same tables, views and columns as a SQLite store.
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("s.db");
    drop(SqliteStore::open(&db).expect("sqlite"));
    let (lite, post) = (sqlite_columns(&db), pg_columns(&pg.url));
    assert!(lite.len() > 100, "{}", lite.len());
    assert_eq!(lite.difference(&post).collect::<Vec<_>>(), Vec::<&(String, String)>::new(), "columns only SQLite has");
    assert_eq!(post.difference(&lite).collect::<Vec<_>>(), Vec::<&(String, String)>::new(), "columns only PostgreSQL has");

    // Exact cache: per tenant; REFRESH supersedes.
    assert_eq!(store.find_exact("a", "k").expect("lookup"), None);
    let first = store.record_inference(&sample("a", Some("k"), ServedFrom::Model, CacheMode::Auto)).expect("record");
    let hit = store.find_exact("a", "k").expect("lookup").expect("hit");
    assert_eq!((hit.inference_id, hit.response_tokens.as_slice(), hit.tokens_computed), (first, &[1u32, 2, 3][..], 12));
    assert_eq!(hit.prompt_token_ids.as_deref(), Some(&[7u32, 8, 9][..]), "the prompt's ids come back with the answer");
    assert_eq!(store.find_exact("b", "k").expect("lookup"), None, "another tenant must not see it");
    let second = store.record_inference(&sample("a", Some("k"), ServedFrom::Model, CacheMode::Refresh)).expect("refresh");
    assert_eq!(store.find_exact("a", "k").expect("lookup").expect("hit").inference_id, second);

    // Facts: learned, strengthened on repeat, user facts answer their question, per tenant.
    let r = store.learn("a", first, Some("What is the capital of France?"), "ph", "The capital of France is Paris. It is a big city.").expect("learn");
    assert_eq!((r.added, r.strengthened), (2, 0));
    let r2 = store.learn("a", second, Some("What is the capital of France?"), "ph", "The capital of France is Paris. It is a big city.").expect("learn");
    assert_eq!((r2.added, r2.strengthened, r2.chain_id), (0, 2, r.chain_id));
    let put = store.put_fact("a", "Paris is the capital of France.", Some("what is the capital of france"), 1.0).expect("put");
    assert_eq!(store.fact_answer("a", "What is the capital of France?").expect("fact").map(|f| f.id), Some(put.fact.id));
    assert_eq!(store.fact_answer("b", "What is the capital of France?").expect("fact"), None);
    // The user fact superseded the model's facts about the question (degraded, kept).
    assert_eq!(put.superseded.len(), 2);
    assert_eq!(store.search_facts("a", "paris", 10, false).expect("search").len(), 1);
    assert_eq!(store.search_facts("a", "paris", 10, true).expect("search").len(), 2);
    assert!(store.search_facts("b", "", 10, true).expect("search").is_empty());

    // Vectors: nearest first, inside the scope only; outcomes per tenant.
    let b = store.record_inference(&sample("b", Some("k2"), ServedFrom::Model, CacheMode::Auto)).expect("b");
    store.index_prompt("a", "scope-a", second, &unit(&[(0, 1.0)])).expect("index");
    store.index_prompt("b", "scope-b", b, &unit(&[(0, 1.0)])).expect("index");
    let near = store.nearest_answers("scope-a", &unit(&[(0, 1.0), (1, 0.1)]), 5, 0.5).expect("knn");
    assert_eq!(near.iter().map(|n| n.inference_id).collect::<Vec<_>>(), vec![second]);
    assert!(near[0].similarity > 0.99 && near[0].max_tokens == 40, "{near:?}");
    let o = Outcome { source_inference_id: second, similarity: 0.93, correct: false };
    store.record_outcome("a", "mid", b, &o, 10, 2).expect("outcome");
    assert_eq!(store.outcomes("a", "mid").expect("outcomes"), vec![o]);
    assert!(store.outcomes("b", "mid").expect("outcomes").is_empty());
    assert_eq!(store.lowest_wrong_similarity(second).expect("min"), Some(0.93));
    // Issue 22's additions: log-probabilities come back with the neighbour, drafts and
    // EQUIVALENT observations per tenant and model.
    assert_eq!(near[0].logprobs, Some(vec![-0.5, -0.25, -1.0]));
    assert_eq!(store.draft_outcomes("a", "mid").expect("drafts"), vec![(0.93, 10, 2)]);
    let e = EquivalenceObservation {
        source_inference_id: second,
        similarity: 0.9,
        mean_margin: -0.2,
        worst_margin: -1.5,
        candidate_ll: -0.8,
        fresh_ll: -0.6,
        acceptable: true,
    };
    store.record_equivalence("a", "mid", b, &e).expect("equivalence");
    assert_eq!(store.equivalence_observations("a", "mid").expect("read"), vec![e]);
    assert!(store.equivalence_observations("b", "mid").expect("read").is_empty());
    // Issue 16's model fingerprint cache, in the shared table: hashed once, then remembered.
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"GGUF not really a model").expect("model file");
    let id = store.model_identity(&model).expect("identity");
    assert!(id.hashed_now);
    assert_eq!(id.sha256, forge_cache::store::sha256_file(&model).expect("hash"));
    assert!(!again.model_identity(&model).expect("identity").hashed_now, "another replica finds it");

    // Stats per tenant and in total; `sql` reads and refuses writes.
    let a = store.tenant_stats("a", None).expect("stats");
    assert_eq!((a.requests, a.live_facts, a.degraded_facts, a.reasoning_chains), (2, 1, 2, 1));
    let ro = ReadOnlyStore::open(std::path::Path::new(&pg.url)).expect("read-only");
    let all = ro.stats(&Default::default()).expect("stats");
    assert_eq!(all.iter().map(|s| (s.tenant.as_str(), s.requests)).collect::<Vec<_>>(), vec![("a", 2), ("b", 1), ("*", 3)]);
    let v = ro.run_read_only("SELECT tenant, requests, share FROM v_hit_rates ORDER BY tenant", 10).expect("view");
    assert_eq!(v.rows[0][1], serde_json::json!(2));
    for write in [
        "INSERT INTO facts (tenant, content, content_norm, confidence, source_type) VALUES ('a', 'x', 'x', 1, 'user_provided')",
        "UPDATE inferences SET response = 'x'",
        "DELETE FROM inferences",
        "DROP TABLE facts",
        "WITH d AS (DELETE FROM inferences RETURNING id) SELECT count(*) FROM d",
        "SELECT 1; DELETE FROM inferences",
        "COMMIT",
    ] {
        let err = ro.run_read_only(write, 10).expect_err(write);
        assert!(matches!(err, StoreError::Refused(_) | StoreError::Invalid(_)), "{write}: {err}");
    }
    assert_eq!(store.tenant_stats("a", None).expect("stats").requests, 2, "nothing was written");
    // `sql --timeout`: statement_timeout stops a long query, TimedOut; a quick one is unaffected.
    let mut ro = ro;
    let limit = Some(std::time::Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    let err = ro.run_read_only_within("SELECT pg_sleep(5)", 10, limit).expect_err("stopped");
    assert!(matches!(err, StoreError::TimedOut(_)), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(ro.run_read_only_within("SELECT 1", 10, limit).expect("quick").rows.len(), 1);
    assert_eq!(ro.run_read_only("SELECT 1", 10).expect("no limit").rows.len(), 1);
}

#[test]
fn concurrent_replicas_never_duplicate_or_lose_a_write() {
    let pg = PgServer::start();
    let replicas: Vec<Arc<Store>> = (0..2).map(|_| Arc::new(Store::open_db(std::path::Path::new(&pg.url)).expect("open"))).collect();
    let source = replicas[0].record_inference(&sample("t", Some("key"), ServedFrom::Model, CacheMode::Auto)).expect("source");
    const WRITERS: usize = 8;
    const ROUNDS: usize = 10;
    let barrier = Arc::new(Barrier::new(WRITERS));
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = replicas[w % 2].clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                barrier.wait();
                for round in 0..ROUNDS {
                    // The same claims from every writer at once.
                    if let Err(e) = store.learn("t", source, Some("Where is the Louvre?"), "ph", "The Louvre is in Paris. It is a museum.") {
                        errors.push(format!("learn: {e}"));
                    }
                    if let Err(e) = store.put_fact("t", "The Seine flows through Paris.", Some("Which river flows through Paris?"), 0.9) {
                        errors.push(format!("put: {e}"));
                    }
                    if let Err(e) = store.index_fact("t", source + round as i64, &unit(&[(round, 1.0)])) {
                        errors.push(format!("index: {e}"));
                    }
                    if let Err(e) = store.record_inference(&sample("t", Some("key"), ServedFrom::Exact, CacheMode::Auto)) {
                        errors.push(format!("record: {e}"));
                    }
                }
                errors
            })
        })
        .collect();
    let errors: Vec<String> = handles.into_iter().flat_map(|h| h.join().expect("writer")).collect();
    assert!(errors.is_empty(), "{errors:?}");

    let ro = ReadOnlyStore::open(std::path::Path::new(&pg.url)).expect("read-only");
    let one = |sql: &str| ro.run_read_only(sql, 10).expect(sql).rows[0][0].as_i64().expect(sql);
    // learn: 2 model facts (one per claim, never duplicated); every repeat strengthened one.
    assert_eq!(one("SELECT count(*) FROM facts WHERE source_type = 'inference'"), 2);
    let n = (WRITERS * ROUNDS) as i64;
    // The first learn added each claim; the n - 1 others strengthened it (no lost update).
    assert_eq!(one("SELECT reuse_count FROM facts WHERE content_norm = 'it is a museum'"), n - 1);
    assert_eq!(one("SELECT reuse_count FROM facts WHERE content_norm = 'the louvre is in paris'"), n - 1);
    assert_eq!(one("SELECT count(*) FROM facts WHERE source_type = 'user_provided'"), 1, "one user fact, repeated puts strengthen it");
    assert_eq!(one("SELECT reuse_count FROM facts WHERE source_type = 'user_provided'"), n - 1);
    assert_eq!(one("SELECT count(*) FROM reasoning_chains"), 1);
    assert_eq!(one("SELECT reuse_count FROM reasoning_chains"), n - 1);
    assert_eq!(one("SELECT count(*) FROM fact_vectors"), ROUNDS as i64, "each fact vector stored once");
    assert_eq!(one("SELECT count(*) FROM inferences"), n + 1, "every acknowledged request recorded");
    assert_eq!(replicas[1].find_exact("t", "key").expect("exact").map(|a| a.inference_id), Some(source));
}

/// The shared KV tier (`--kv-storage blob`) from two replicas' stores, four writers each storing
/// the same new blocks at once: every block is stored once with its bytes, every request's
/// numbers are recorded (none lost to the unique block key), each replica loads what the other
/// stored, the shared budget holds, and a damaged block is deleted and never returned.
#[test]
fn shared_kv_blocks_are_stored_once_by_concurrent_replicas() {
    use forge_cache::workload::disk::{NewBlock, Record};
    use forge_cache::workload::{Block, Codec, Geometry, SharedTier};
    const G: Geometry = Geometry { rows: 2, head_dim: 32, block_tokens: 4 };
    let pg = PgServer::start();
    let url = std::path::Path::new(&pg.url);
    let stores: Vec<Store> = (0..2).map(|_| Store::open_db(url).expect("open")).collect();
    let bytes = Codec::F16.block_bytes(&G) as u64;
    let tier = |s: &Store, budget: u64| match s {
        Store::Postgres(p) => SharedTier::open(p, G, Codec::F16, budget).expect("shared tier"),
        Store::Sqlite(_) => unreachable!("a PostgreSQL URL"),
    };
    let tiers: Vec<Arc<SharedTier>> = stores.iter().map(|s| Arc::new(tier(s, 6 * bytes))).collect();
    let block = |i: usize| {
        let vals = |s: f32| (0..G.values()).map(|j| half::f16::from_f32((j as f32 * 0.01 + i as f32) * s)).collect();
        NewBlock { key: [i as u8 + 1; 32], parent: i.checked_sub(1).map(|p| [p as u8 + 1; 32]), position: 4 * i, tokens: vec![i as u32; 4], block: Arc::new(Block { k: vals(1.0), v: vals(-1.0) }) }
    };
    let blocks: Arc<Vec<NewBlock>> = Arc::new((0..4).map(block).collect());
    const WRITERS: usize = 8;
    let ids: Vec<i64> = (0..WRITERS).map(|_| stores[0].record_inference(&sample("t", None, ServedFrom::Model, CacheMode::Auto)).expect("inference")).collect();
    let barrier = Arc::new(Barrier::new(WRITERS));
    let handles: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(w, &id)| {
            let (tier, blocks, barrier) = (tiers[w % 2].clone(), blocks.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                tier.record(&Record {
                    tenant: "t",
                    model_id: "m",
                    inference_id: id,
                    used: &[],
                    new_blocks: &blocks,
                    prompt_blocks: 4,
                    blocks_memory: 0,
                    blocks_disk: 0,
                    blocks_corrupt: 0,
                    kv_tokens_reused: 0,
                    partial_tokens: 0,
                    prompt_tokens: 16,
                    blend_tokens_reused: 0,
                    blend_tokens_recomputed: 0,
                    load_ms: 0.0,
                    memory_bytes: 0,
                    fragment: None,
                })
            })
        })
        .collect();
    let stored: Vec<usize> = handles.into_iter().map(|h| h.join().expect("writer").expect("record")).collect();
    assert_eq!(stored.iter().sum::<usize>(), 4, "each block stored by exactly one writer: {stored:?}");
    let ro = ReadOnlyStore::open(url).expect("read-only");
    let one = |sql: &str| ro.run_read_only(sql, 10).expect(sql).rows[0][0].as_i64().expect(sql);
    assert_eq!(one("SELECT count(*) FROM kv_lineage"), 4);
    assert_eq!(one("SELECT count(*) FROM kv_block_data"), 4);
    assert_eq!(one("SELECT count(*) FROM kv_requests"), WRITERS as i64, "every writer's request recorded");

    // Each replica loads what was stored, in order, byte for byte; the children index too.
    let keys: Vec<[u8; 32]> = blocks.iter().map(|b| b.key).collect();
    for t in &tiers {
        let (got, bad) = t.load(&keys).expect("load");
        assert_eq!((got.len(), bad), (4, 0));
        assert!(got.iter().zip(blocks.iter()).all(|(g, b)| **g == *b.block));
        let first = t.children("t", "m", None).expect("children");
        assert_eq!(first.iter().map(|c| c.key).collect::<Vec<_>>(), vec![keys[0]]);
        assert!(t.children("other", "m", None).expect("children").is_empty(), "tenants apart");
    }

    // The budget (6 blocks for the whole table) holds when more arrive: the least recently used go.
    let more: Vec<NewBlock> = (4..8).map(block).collect();
    let id = stores[1].record_inference(&sample("t", None, ServedFrom::Model, CacheMode::Auto)).expect("inference");
    let r = Record { tenant: "t", model_id: "m", inference_id: id, used: &[], new_blocks: &more, prompt_blocks: 4, blocks_memory: 0, blocks_disk: 0, blocks_corrupt: 0,
        kv_tokens_reused: 0, partial_tokens: 0, prompt_tokens: 16, blend_tokens_reused: 0, blend_tokens_recomputed: 0, load_ms: 0.0, memory_bytes: 0, fragment: None };
    assert_eq!(tiers[1].record(&r).expect("record"), 4);
    assert_eq!(one("SELECT count(*) FROM kv_lineage"), 6);
    assert_eq!(tiers[1].usage(), (6 * bytes, 6));
    let resident = |ks: &[[u8; 32]]| ks.iter().filter(|k| tiers[0].load(std::slice::from_ref(*k)).expect("load").0.len() == 1).count();
    assert_eq!(resident(&keys), 2, "two of the older blocks were evicted");
    assert_eq!(resident(&more.iter().map(|b| b.key).collect::<Vec<_>>()), 4, "the request's own blocks stay");

    // A damaged block is detected, deleted and not returned.
    let mut raw = postgres::Client::connect(&pg.url, postgres::NoTls).expect("a raw connection");
    raw.execute("UPDATE kv_block_data SET data = overlay(data placing '\\x00ff'::bytea from 101 for 2) WHERE lineage_id = (SELECT id FROM kv_lineage WHERE position = 28)", &[]).expect("damage");
    let last = [more[3].key];
    assert_eq!(tiers[0].load(&last).expect("load"), (Vec::new(), 1), "damage found");
    assert_eq!(tiers[0].load(&last).expect("load"), (Vec::new(), 0), "and the row is gone");
    assert_eq!(one("SELECT count(*) FROM kv_lineage"), 5);
}

#[test]
fn a_lost_database_is_unavailable_then_reconnected() {
    let pg = PgServer::start();
    let store = Store::open_db(std::path::Path::new(&pg.url)).expect("open");
    let id = store.record_inference(&sample("t", Some("k"), ServedFrom::Model, CacheMode::Auto)).expect("record");
    pg.pause();
    for _ in 0..2 {
        let err = store.find_exact("t", "k").expect_err("the database is gone");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    }
    assert!(matches!(store.record_inference(&sample("t", None, ServedFrom::Model, CacheMode::Auto)), Err(StoreError::Unavailable(_))));
    pg.resume();
    assert_eq!(store.find_exact("t", "k").expect("reconnected").map(|a| a.inference_id), Some(id));
    assert_eq!(store.tenant_stats("t", None).expect("stats").requests, 1, "the failed write left nothing behind");
}

/// KNN latency of the pgvector HNSW index at 10k and 100k 384-d vectors (one scope, the worst
/// case for the scope filter). A measurement, not a check: run with
/// `cargo test --release --test store_postgres -- --ignored --nocapture knn_latency`.
#[test]
#[ignore]
fn knn_latency() {
    let pg = PgServer::start();
    let store = PgStore::open(&pg.url).expect("open");
    let ro = ReadOnlyStore::open(std::path::Path::new(&pg.url)).expect("ro");
    let mut c = postgres::Client::connect(&pg.url, postgres::NoTls).expect("client");
    let mut have = 0usize;
    c.batch_execute("SET maintenance_work_mem = '1GB'; SET max_parallel_maintenance_workers = 0").expect("settings");
    for n in [10_000usize, 100_000] {
        // Bulk load without the index, then build it (what a restore or a first import does).
        c.batch_execute("DROP INDEX prompt_vectors_hnsw").expect("drop index");
        let t = std::time::Instant::now();
        c.execute(
            "INSERT INTO prompt_vectors (scope, embedding, inference_id, tenant)
             SELECT 's', (SELECT array_agg(random() - 0.5)::real[] FROM generate_series(1, 384) WHERE g > 0)::vector, g, 't'
             FROM generate_series($1::bigint, $2::bigint) g",
            &[&(have as i64 + 1), &(n as i64)],
        )
        .expect("insert");
        have = n;
        let loaded = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        c.batch_execute("CREATE INDEX prompt_vectors_hnsw ON prompt_vectors USING hnsw (embedding vector_cosine_ops); ANALYZE prompt_vectors")
            .expect("index");
        eprintln!("{n} vectors: loaded in {loaded:.1} s, HNSW built in {:.1} s", t.elapsed().as_secs_f64());
        let q: Vec<f32> = (0..384).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect();
        let mut times = Vec::new();
        for i in 0..50 {
            let mut q = q.clone();
            q[i] += 0.3;
            let t = std::time::Instant::now();
            let v = pgvector::Vector::from(q);
            let rows = c.query("SELECT inference_id FROM prompt_vectors WHERE scope = 's' ORDER BY embedding <=> $1 LIMIT 5", &[&v]).expect("knn");
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(rows.len(), 5);
        }
        times.sort_by(f64::total_cmp);
        let plan = ro
            .run_read_only("EXPLAIN SELECT inference_id FROM prompt_vectors WHERE scope = 's' ORDER BY embedding <=> (SELECT embedding FROM prompt_vectors LIMIT 1) LIMIT 5", 20)
            .expect("explain");
        let uses_hnsw = plan.rows.iter().any(|r| r[0].as_str().unwrap_or("").contains("prompt_vectors_hnsw"));
        eprintln!("k=5 KNN over {n}: p50 {:.2} ms, p95 {:.2} ms (HNSW index used: {uses_hnsw})", times[25], times[47]);
    }
    drop(store);
}
