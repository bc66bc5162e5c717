//! KV-block reuse over real gRPC with the real model: prompts sharing 0%, ~50%, ~99% and 100%
//! of their tokens with earlier ones reuse exactly the tokens they share — whole blocks, then the
//! leading tokens of the block they diverge inside or of a stored tail — and answer token
//! for token like BYPASS (which reuses and stores nothing); after a restart the blocks come from
//! disk with the same answers; a damaged block is detected and recomputed; the disk budget holds;
//! sequences with different reused lengths share forward passes and keep their solo answers.

mod common;

use common::{ask, service_with, service_with_on, sql_i64, start, with_mode, RealModel, Scratch};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::gguf::GgufFile;
use forge_cache::server::client::{Client, Generated};
use forge_cache::server::proto::{CacheMode, GenerateRequest, ServedFrom};
use forge_cache::server::ServerConfig;
use forge_cache::workload::{disk::side_file_path, KvConfig, Storage};

const BLOCK: usize = 16;
/// Bytes of one f16 block of SmolLM2-135M: 30 layers x 3 KV heads x 16 tokens x 64 x 2 (K, V) x 2.
const BLOCK_BYTES: u64 = 30 * 3 * 16 * 64 * 2 * 2;

/// The first `n` SQuAD dev paragraphs of one article, joined (the Super Bowl 50 article).
fn squad(n: usize) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/squad/squad_v1.1_dev_contexts.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (the tests need ../shared/data)", path.display()));
    let paras: Vec<String> = text
        .lines()
        .take(n)
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["context"].as_str().expect("context").to_string())
        .collect();
    paras.join("\n\n")
}

fn raw(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest { prompt: prompt.into(), raw: true, max_tokens: Some(max_tokens), ..Default::default() }
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A sequence computed earlier: its prompt, and its prompt followed by its answer (the stored
/// KV covers the prompt and at most the answer).
struct Seen {
    prompt: Vec<u32>,
    all: Vec<u32>,
}

/// What KV reuse should load for `ids` after the sequences `earlier`: every token shared with
/// one of them (at least what the prompts share, at most what prompt and answer share), leaving
/// at least the last token to compute.
fn expected_reuse(ids: &[u32], earlier: &[Seen]) -> (usize, usize) {
    let lo = earlier.iter().map(|e| lcp(ids, &e.prompt)).max().unwrap_or(0);
    let hi = earlier.iter().map(|e| lcp(ids, &e.all)).max().unwrap_or(0);
    (lo.min(ids.len() - 1), hi.min(ids.len() - 1))
}

/// The request with KV reuse, checked against its BYPASS answer; returns it.
async fn check(c: &mut Client, req: GenerateRequest, earlier: &mut Vec<Seen>, what: &str) -> Generated {
    let reference = c.generate(with_mode(req.clone(), CacheMode::Bypass)).await.expect("bypass");
    assert_eq!(reference.outcome.kv_tokens_reused, 0, "BYPASS reuses nothing");
    let g = c.generate(req).await.expect("generate");
    assert_eq!(g.served_from(), ServedFrom::Model, "{what}");
    let ids = &g.outcome.prompt_token_ids;
    let (lo, hi) = expected_reuse(ids, earlier);
    let shared = earlier.iter().map(|e| lcp(ids, &e.prompt)).max().unwrap_or(0);
    eprintln!("{what}: {} prompt tokens, {:.1}% shared, {} reused, ttft {:.0} ms", ids.len(), 100.0 * shared as f64 / ids.len() as f64, g.outcome.kv_tokens_reused, g.outcome.ttft_ms);
    let reused = g.outcome.kv_tokens_reused as usize;
    assert!((lo..=hi).contains(&reused), "{what}: {reused} positions reused, {lo}..={hi} shared with earlier sequences");
    assert_eq!(g.outcome.tokens_reused, g.outcome.kv_tokens_reused, "{what}");
    assert_eq!((&g.tokens, &g.text), (&reference.tokens, &reference.text), "{what}: the answer with reuse differs from BYPASS");
    let fed_back = g.outcome.tokens_computed as usize + reused - ids.len();
    assert!(fed_back <= g.tokens.len(), "{what}: computed = prompt - reused + decode steps");
    earlier.push(Seen { prompt: ids.clone(), all: ids.iter().chain(&g.tokens).copied().collect() });
    g
}

fn kv_config(tweak: impl FnOnce(&mut KvConfig)) -> impl FnOnce(&mut ServerConfig, &Scratch) {
    move |c, _| {
        let mut k = KvConfig::default();
        tweak(&mut k);
        c.kv = Some(k);
        // KV reuse alone: no semantic drafts, so every computed answer is MODEL and reused
        // tokens are KV positions only (the tiers together: tests/service_semantic.rs).
        c.embedder = None;
    }
}

async fn shared_prefixes_are_reused_block_for_block_with_identical_answers(m: RealModel) {
    let (scratch, server, mut c) = service_with_on(m, kv_config(|_| {})).await;
    let db = &scratch.db;
    let doc = squad(2);
    let p = format!("{doc}\n\nQuestion: Which NFL team represented the AFC at Super Bowl 50?\nAnswer:");
    let mut earlier = Vec::new();

    // BYPASS stores nothing.
    c.generate(with_mode(raw(&p, 8), CacheMode::Bypass)).await.expect("bypass");
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM kv_lineage") + sql_i64(db, "SELECT COUNT(*) FROM kv_requests"), 0);

    let first = check(&mut c, raw(&p, 8), &mut earlier, "0% shared (first prompt)").await;
    assert_eq!(first.outcome.kv_tokens_reused, 0);
    let n = first.outcome.prompt_token_ids.len();
    assert!(n > 300, "{n} tokens");
    // Every whole block of what was computed (the prompt, then the answer tokens fed back, as
    // far as they were published), and the prompt's partial tail.
    let computed = first.outcome.tokens_computed as usize;
    assert!(computed >= n);
    let whole = sql_i64(db, &format!("SELECT COUNT(*) FROM kv_lineage WHERE token_count = {BLOCK}")) as usize;
    assert!((n / BLOCK..=computed / BLOCK).contains(&whole), "every whole prompt block is stored: {whole} of {n} prompt / {computed} computed tokens");
    if n % BLOCK != 0 {
        assert!(sql_i64(db, &format!("SELECT COUNT(*) FROM kv_lineage WHERE token_count < {BLOCK}")) >= 1, "the prompt's tail is stored");
    }

    let unrelated = check(&mut c, raw("Once upon a time, in a land far away, there lived a dragon who", 8), &mut earlier, "0% shared").await;
    // Only the tokens it shares with the first prompt (a model that adds BOS shares that one).
    let common = lcp(&unrelated.outcome.prompt_token_ids, &first.outcome.prompt_token_ids);
    assert!(common < BLOCK && unrelated.outcome.kv_tokens_reused as usize <= common, "{} reused, {common} shared", unrelated.outcome.kv_tokens_reused);

    // The first half of the document, then as much other text.
    let half = &doc[..doc.len() / 2];
    let other = squad(4).split("\n\n").nth(3).expect("paragraph 4").to_string();
    let h = check(&mut c, raw(&format!("{half} {}", &other[..other.len().min(doc.len() / 2)]), 8), &mut earlier, "~50% shared").await;
    let share = h.outcome.kv_tokens_reused as f64 / h.outcome.prompt_token_ids.len() as f64;
    assert!((0.3..0.7).contains(&share), "about half reused: {share}");

    let p99 = format!("{doc}\n\nQuestion: Which NFL team represented the AFC at Super Bowl 50?\nReply:");
    let g = check(&mut c, raw(&p99, 8), &mut earlier, "~99% shared").await;
    assert!(g.outcome.kv_tokens_reused as usize >= g.outcome.prompt_token_ids.len() - 2 * BLOCK);

    // 100%: the same prompt (another max_tokens, so the exact cache does not answer it).
    let g = check(&mut c, raw(&p, 6), &mut earlier, "100% shared").await;
    assert_eq!(g.outcome.kv_tokens_reused as usize, n - 1, "the whole blocks and the stored tail");
    // Diverging inside a block: the leading tokens of that block are reused, not recomputed.
    let mid = check(&mut c, raw(&format!("{doc}\n\nQuestion: Which NFL team represented the NFC at Super Bowl 50?\nAnswer:"), 4), &mut earlier, "diverging inside a block").await;
    let ids = &mid.outcome.prompt_token_ids;
    let shared = lcp(ids, &first.outcome.prompt_token_ids);
    assert!(shared % BLOCK == 0 || mid.outcome.kv_tokens_reused as usize > shared / BLOCK * BLOCK, "{shared} shared tokens, {} reused", mid.outcome.kv_tokens_reused);
    // A prompt of whole blocks, all seen before: all but its last token is loaded.
    let tok = Tokenizer::from_gguf(&GgufFile::open(m.path()).expect("gguf")).expect("tokenizer");
    let exact_blocks = (0..40)
        .map(|k| format!("{doc}\n\nQuestion: Which NFL team represented the AFC at Super Bowl 50?{}", " Answer".repeat(k)))
        .find(|t| tok.encode_prompt(t).expect("encode").len() % BLOCK == 0)
        .expect("some length is a multiple of 16");
    check(&mut c, raw(&format!("{exact_blocks} now:"), 4), &mut earlier, "longer prompt").await;
    let g = check(&mut c, raw(&exact_blocks, 4), &mut earlier, "100% shared, whole blocks").await;
    assert_eq!(g.outcome.kv_tokens_reused as usize, g.outcome.prompt_token_ids.len() - 1);

    // Recorded: inferences, kv_requests, the reused prefix as a fragment.
    let reused = sql_i64(db, "SELECT SUM(kv_tokens_reused) FROM inferences");
    assert!(reused > 0);
    assert_eq!(sql_i64(db, "SELECT SUM(kv_tokens_reused) FROM kv_requests"), reused);
    assert!(sql_i64(db, "SELECT MAX(reuse_count) FROM semantic_fragments WHERE kind = 'kv_prefix'") >= 2, "the document prefix recurred");
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM kv_requests WHERE blocks_disk > 0"), 0, "all from memory");
    // The view tells partial-block reuse and computed prompt tokens apart.
    let partial = sql_i64(db, "SELECT partial_tokens_reused FROM v_kv_reuse");
    assert!(partial > 0, "tokens of partly shared blocks were reused");
    assert_eq!(partial, sql_i64(db, "SELECT SUM(partial_tokens) FROM kv_requests"));
    assert_eq!(
        sql_i64(db, "SELECT prompt_tokens_computed FROM v_kv_reuse"),
        sql_i64(db, "SELECT SUM(prompt_tokens) - SUM(kv_tokens_reused) FROM inferences WHERE cache_mode != 'bypass'")
    );
    server.stop().await.expect("stop");
}

on_both_models!(shared_prefixes_reused, super::shared_prefixes_are_reused_block_for_block_with_identical_answers);

fn question(doc: &str, q: &str, max_tokens: u32) -> GenerateRequest {
    ask(&format!("{doc}\n\nQuestion: {q}"), max_tokens)
}

/// After a restart every reused block comes from disk, with the same answers; a damaged block
/// (side file or BLOB) is detected, recomputed and stored again, never served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_blocks_come_from_disk_and_damage_is_recomputed() {
    for storage in [Storage::File, Storage::Blob] {
        let (scratch, server, mut c) = service_with(kv_config(|k| k.storage = storage)).await;
        let db = scratch.db.clone();
        let config = || {
            let mut c = common::server_config(&db);
            c.kv = Some(KvConfig { storage, ..KvConfig::default() });
            c.embedder = None;
            c
        };
        let doc = squad(1);
        let mut earlier = Vec::new();
        check(&mut c, question(&doc, "Who won Super Bowl 50?", 8), &mut earlier, "cold").await;
        server.stop().await.expect("stop");

        // Restart: the same document with another question, every block from disk.
        let server = start(config()).await;
        let mut c = common::client(&server).await;
        let g = check(&mut c, question(&doc, "Where was Super Bowl 50 played?", 8), &mut earlier, "after restart").await;
        let blocks = g.outcome.kv_tokens_reused as i64 / BLOCK as i64;
        assert!(blocks >= 8, "{storage:?}: {blocks} blocks reused");
        let id = g.outcome.inference_id;
        let (mem, disk) = (
            sql_i64(&db, &format!("SELECT blocks_memory FROM kv_requests WHERE inference_id = {id}")),
            sql_i64(&db, &format!("SELECT blocks_disk FROM kv_requests WHERE inference_id = {id}")),
        );
        assert_eq!((mem, disk), (0, blocks), "{storage:?}: every block from disk");
        // Read once, then served from memory.
        let g = check(&mut c, question(&doc, "When was Super Bowl 50 played?", 8), &mut earlier, "again, from memory").await;
        let id = g.outcome.inference_id;
        assert_eq!(sql_i64(&db, &format!("SELECT blocks_disk FROM kv_requests WHERE inference_id = {id}")), 0);
        server.stop().await.expect("stop");

        // Damage the third block's bytes, restart: blocks 0 and 1 load, block 2 is detected
        // and recomputed, and the answer is still the BYPASS answer.
        let conn = rusqlite::Connection::open(&db).expect("open db");
        let (row, slot): (i64, Option<i64>) =
            conn.query_row("SELECT id, slot FROM kv_lineage WHERE position = 32 AND parent_key IS NOT NULL", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("block 2");
        match storage {
            Storage::File => {
                let path = side_file_path(&db);
                let mut bytes = std::fs::read(&path).expect("side file");
                let at = slot.expect("slot") as usize * BLOCK_BYTES as usize + 1000;
                bytes[at] ^= 0x21;
                std::fs::write(&path, bytes).expect("write side file");
            }
            Storage::Blob => {
                let mut data: Vec<u8> = conn.query_row("SELECT data FROM kv_block_data WHERE lineage_id = ?1", [row], |r| r.get(0)).expect("blob");
                data[1000] ^= 0x21;
                conn.execute("UPDATE kv_block_data SET data = ?1 WHERE lineage_id = ?2", rusqlite::params![data, row]).expect("damage blob");
            }
        }
        drop(conn);
        let server = start(config()).await;
        let mut c = common::client(&server).await;
        let req = question(&doc, "Who was the MVP of Super Bowl 50?", 8);
        let reference = c.generate(with_mode(req.clone(), CacheMode::Bypass)).await.expect("bypass");
        let g = c.generate(req).await.expect("damaged");
        assert_eq!(g.outcome.kv_tokens_reused as usize, 2 * BLOCK, "{storage:?}: only the blocks before the damaged one");
        assert_eq!(g.tokens, reference.tokens, "{storage:?}: identical answer after recomputing");
        let id = g.outcome.inference_id;
        assert_eq!(sql_i64(&db, &format!("SELECT blocks_corrupt FROM kv_requests WHERE inference_id = {id}")), 1);
        assert!(sql_i64(&db, &format!("SELECT blocks_stored FROM kv_requests WHERE inference_id = {id}")) > 0, "recomputed blocks are stored again");
        // The recomputed block is good again: a later restart loads the whole prefix.
        server.stop().await.expect("stop");
        let server = start(config()).await;
        let mut c = common::client(&server).await;
        let g = check(&mut c, question(&doc, "What color was used to emphasize the 50th anniversary?", 8), &mut earlier, "repaired").await;
        assert!(g.outcome.kv_tokens_reused as i64 >= blocks * BLOCK as i64, "{storage:?}");
        server.stop().await.expect("stop");
    }
}

/// The disk tier never holds more than its budget: rows, bytes, and the side file's length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_budget_is_never_exceeded() {
    let budget = 5 * BLOCK_BYTES + 1000;
    let (scratch, server, mut c) = service_with(kv_config(|k| k.disk_bytes = budget)).await;
    let db = &scratch.db;
    let doc = squad(3);
    let paras: Vec<&str> = doc.split("\n\n").collect();
    let mut seen = 0;
    for (i, p) in paras.iter().enumerate() {
        let g = c.generate(raw(&format!("{p}\nIn one word, the topic is"), 2)).await.expect("generate");
        // Paragraphs may share a leading token or two (reused), never a whole block.
        assert!((g.outcome.kv_tokens_reused as usize) < BLOCK);
        seen += g.outcome.prompt_token_ids.len() / BLOCK;
        let rows = sql_i64(db, "SELECT COUNT(*) FROM kv_lineage");
        let bytes = sql_i64(db, "SELECT COALESCE(SUM(size_bytes), 0) FROM kv_lineage");
        let file = std::fs::metadata(side_file_path(db)).map_or(0, |m| m.len());
        eprintln!("after prompt {i}: {seen} blocks computed, {rows} stored, {bytes} bytes, side file {file} bytes (budget {budget})");
        assert!(rows <= 5 && bytes as u64 <= budget && file <= budget, "over budget: {rows} rows, {bytes} bytes, file {file}");
        assert_eq!(sql_i64(db, &format!("SELECT COUNT(*) FROM kv_lineage WHERE inference_id = {}", g.outcome.inference_id)), rows.min(5), "the newest blocks are kept");
    }
    assert!(seen > 10, "more blocks computed ({seen}) than the budget holds");
    server.stop().await.expect("stop");
}

/// Sequences that reuse different lengths (a long stored prefix, none) run in one continuous
/// batch and give exactly their solo answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_reused_lengths_in_one_batch_keep_their_solo_answers() {
    let (_scratch, server, mut c) = service_with(kv_config(|_| {})).await;
    let doc = squad(2);
    c.generate(question(&doc, "Who won Super Bowl 50?", 4)).await.expect("warm the document");
    let requests = vec![
        question(&doc, "Which team did the Broncos beat?", 12),
        raw(&format!("{} Tell me more:", "The river flows past the old mill and the children play by the water. ".repeat(10)), 10),
        ask("What is 2 + 2?", 10),
        question(&doc[..doc.len() / 2], "Summarize this.", 12),
    ];
    let mut solo = Vec::new();
    for r in &requests {
        solo.push(c.generate(with_mode(r.clone(), CacheMode::Bypass)).await.expect("solo"));
    }
    let tasks: Vec<_> = requests
        .iter()
        .map(|r| {
            let (mut c, r) = (c.clone(), r.clone());
            tokio::spawn(async move { c.generate(r).await.expect("concurrent") })
        })
        .collect();
    let mut peak = 0;
    let mut reused = Vec::new();
    for (task, alone) in tasks.into_iter().zip(&solo) {
        let together = task.await.expect("join");
        assert_eq!(together.served_from(), ServedFrom::Model);
        assert_eq!(together.tokens, alone.tokens, "tokens differ for {:?}", alone.text);
        peak = peak.max(together.outcome.peak_batch);
        reused.push(together.outcome.kv_tokens_reused);
    }
    eprintln!("reused per request: {reused:?}, peak batch {peak}");
    assert!(peak >= 2, "the requests should have shared forward passes (peak batch {peak})");
    assert!(reused[0] > 200 && reused[1] == 0 && reused[3] > 0 && reused[3] < reused[0], "{reused:?}");
    server.stop().await.expect("stop");
}
