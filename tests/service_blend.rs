//! Cache mode BLEND over real gRPC (and once over HTTP) with the real model: documents given in
//! a request are reused as chunks wherever they recur — in another order, at other positions —
//! and the outcome says BLEND; with every document token recomputed the answer is token for
//! token the full prefill's (BYPASS); BLEND writes no answer cache, so the other modes keep
//! answering as the model does; bad documents are refused with a clear message.

mod common;

use common::{service_with, sql_i64, with_mode, Scratch};
use forge_cache::server::client::Client;
use forge_cache::server::proto::{CacheMode, GenerateRequest, ServedFrom};
use forge_cache::server::ServerConfig;
use forge_cache::workload::KvConfig;

/// SQuAD dev paragraphs `ids` (of the Super Bowl 50 article).
fn paragraphs(ids: &[usize]) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/squad/squad_v1.1_dev_contexts.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e} (the tests need ../shared/data)", path.display()));
    let all: Vec<String> = text.lines().take(8).map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["context"].as_str().expect("context").to_string()).collect();
    ids.iter().map(|&i| all[i].clone()).collect()
}

fn question(docs: Vec<String>, mode: CacheMode) -> GenerateRequest {
    GenerateRequest {
        prompt: "Which NFL team won Super Bowl 50? Answer in a few words.".into(),
        system: "Answer the question from the documents.".into(),
        max_tokens: Some(6),
        cache_mode: mode as i32,
        documents: docs,
        ..Default::default()
    }
}

fn blend_at(recompute: f32) -> impl FnOnce(&mut ServerConfig, &Scratch) {
    move |c, _| {
        c.kv = Some(KvConfig { blend_recompute: recompute, ..KvConfig::default() });
        c.embedder = None;
    }
}

/// Document tokens of a request: the outcome's reused + recomputed ones.
fn doc_tokens(g: &forge_cache::server::client::Generated) -> u32 {
    g.outcome.blend_tokens_reused + g.outcome.blend_tokens_recomputed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_in_two_orders_reuse_their_chunks_and_say_blend() {
    let (scratch, _server, mut c) = service_with(blend_at(0.15)).await;
    let docs = paragraphs(&[0, 3, 4]);
    // One document alone is an exact prefix of its prompt: reused whole, nothing recomputed.
    let alone = c.generate(question(docs[..1].to_vec(), CacheMode::Blend)).await.expect("blend, one document");
    assert_eq!(alone.served_from(), ServedFrom::Blend);
    let first_doc = alone.outcome.blend_tokens_reused;
    assert_eq!((alone.outcome.blend_tokens_recomputed, first_doc > 40), (0, true));
    let first = c.generate(question(docs.clone(), CacheMode::Blend)).await.expect("blend");
    assert_eq!(first.served_from(), ServedFrom::Blend);
    let n = doc_tokens(&first);
    assert!(n > 150, "three paragraphs are documents: {n} tokens");
    // The first document is kept as it is (exact prefix); 15% of the moved ones' tokens are
    // recomputed, the rest reused.
    assert_eq!(first.outcome.blend_tokens_recomputed, (0.15 * (n - first_doc) as f32).round() as u32);

    // The same documents in another order: each chunk's KV is loaded, not computed again.
    let order = vec![docs[2].clone(), docs[0].clone(), docs[1].clone()];
    let second = c.generate(question(order, CacheMode::Blend)).await.expect("blend, reordered");
    assert_eq!(second.served_from(), ServedFrom::Blend);
    assert_eq!(doc_tokens(&second), n);
    assert_ne!(second.outcome.prompt_token_ids, first.outcome.prompt_token_ids, "the prompt changed with the order");
    // The first computed the own KV of the two chunks not seen alone before; the second loaded
    // it: about those documents' tokens fewer computed.
    // (Each recomputes 15% of its moved documents: other documents move in each order.)
    let (o1, o2) = (&first.outcome, &second.outcome);
    let saved = (o1.tokens_computed - o1.blend_tokens_recomputed) as i64 - (o2.tokens_computed - o2.blend_tokens_recomputed) as i64;
    assert!(saved >= (n - first_doc) as i64 - 6, "{saved} fewer tokens computed, the two documents not seen alone have {}", n - first_doc);
    assert!(second.outcome.tokens_computed < second.outcome.prompt_token_ids.len() as u32 / 2, "most of the prompt was reused");

    // Recorded: the mode, the tier, the numbers in kv_requests / v_kv_reuse.
    let db = &scratch.db;
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM inferences WHERE cache_mode = 'blend' AND served_from = 'BLEND'"), 3);
    assert_eq!(sql_i64(db, "SELECT SUM(blend_tokens_reused + blend_tokens_recomputed) FROM kv_requests"), 2 * n as i64 + first_doc as i64);
    assert_eq!(sql_i64(db, "SELECT blend_tokens_recomputed FROM v_kv_reuse"), (o1.blend_tokens_recomputed + o2.blend_tokens_recomputed) as i64);

    // BLEND wrote no answer cache: the same request in AUTO is computed, lossless, as BYPASS.
    let auto = c.generate(question(docs.clone(), CacheMode::Auto)).await.expect("auto");
    assert_eq!(auto.served_from(), ServedFrom::Model);
    let bypass = c.generate(question(docs, CacheMode::Bypass)).await.expect("bypass");
    assert_eq!(bypass.served_from(), ServedFrom::Model);
    assert_eq!((&auto.tokens, doc_tokens(&auto)), (&bypass.tokens, 0));
    assert_eq!(auto.outcome.prompt_token_ids, first.outcome.prompt_token_ids, "documents render the same in every mode");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recomputing_every_document_token_gives_the_full_prefill_answer() {
    let (_scratch, _server, mut c) = service_with(blend_at(1.0)).await;
    let docs = paragraphs(&[1, 2, 5]);
    let reference = c.generate(question(docs.clone(), CacheMode::Bypass)).await.expect("bypass");
    // Chunks first seen in another order, then reused (re-rotated) at new positions.
    let other = vec![docs[1].clone(), docs[2].clone(), docs[0].clone()];
    c.generate(question(other, CacheMode::Blend)).await.expect("blend, first order");
    let g = c.generate(question(docs, CacheMode::Blend)).await.expect("blend");
    assert_eq!(g.served_from(), ServedFrom::Blend);
    // Every moved document token recomputed; the first document (an exact prefix) reused.
    assert!(g.outcome.blend_tokens_reused > 40 && g.outcome.blend_tokens_recomputed > 100, "{:?}", g.outcome);
    assert_eq!(g.outcome.prompt_token_ids, reference.outcome.prompt_token_ids);
    assert_eq!((&g.tokens, &g.text), (&reference.tokens, &reference.text), "100% recompute must be the full prefill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_documents_are_refused_clearly() {
    let (_scratch, _server, mut c) = service_with(blend_at(0.15)).await;
    let refused = |c: &mut Client, r: GenerateRequest| {
        let mut c = c.clone();
        async move { c.generate(r).await.expect_err("refused") }
    };
    let e = refused(&mut c, question(vec!["x".into(); 17], CacheMode::Blend)).await;
    assert!(e.to_string().contains("at most 16"), "{e}");
    let e = refused(&mut c, question(vec!["ok".into(), " ".into()], CacheMode::Blend)).await;
    assert!(e.to_string().contains("document 2"), "{e}");
    let e = refused(&mut c, question(vec!["y".repeat(40_000)], CacheMode::Bypass)).await;
    assert!(e.to_string().contains("document 1"), "{e}");
    let raw = GenerateRequest { raw: true, system: String::new(), ..question(vec!["a doc".into()], CacheMode::Blend) };
    let e = refused(&mut c, raw).await;
    assert!(e.to_string().contains("not with raw"), "{e}");
    // A BLEND request without documents is a plain computed answer, marked BLEND.
    let g = c.generate(with_mode(question(Vec::new(), CacheMode::Blend), CacheMode::Blend)).await.expect("no documents");
    assert_eq!((g.served_from(), doc_tokens(&g)), (ServedFrom::Blend, 0));
}
