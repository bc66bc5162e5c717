//! The exact cache and continuous batching, over real gRPC on loopback, with a real SQLite file
//! and the real model: a repeat is served from EXACT with nothing computed (also after a
//! restart); BYPASS computes and writes nothing; REFRESH recomputes and supersedes; sampled
//! requests without a seed never touch the cache; concurrent greedy requests get exactly their
//! solo answers.

mod common;

use std::time::Duration;

use common::{ask, client, server_config, server_config_on, service, service_on, sql_i64, start, with_mode, RealModel, FRANCE};
use forge_cache::server::proto::{CacheMode, ServedFrom, StopReason};

async fn a_repeat_is_an_exact_hit_even_after_a_restart(m: RealModel) {
    let (scratch, server, mut c) = service_on(m).await;
    let db = &scratch.db;

    let first = c.generate(ask(FRANCE, 16)).await.expect("first");
    assert_eq!(first.served_from(), ServedFrom::Model);
    assert!(!first.text.is_empty());
    // The prompt, then one decode step per token fed back (the last token is fed only when
    // generation went on to sample a stop token).
    let fed_back = if first.outcome.stop_reason == StopReason::Stop as i32 { first.tokens.len() } else { first.tokens.len() - 1 };
    assert_eq!(first.outcome.tokens_computed as usize, first.outcome.prompt_token_ids.len() + fed_back);

    let second = c.generate(ask(FRANCE, 16)).await.expect("second");
    assert_eq!(second.served_from(), ServedFrom::Exact);
    assert_eq!(second.outcome.tokens_computed, 0);
    assert_eq!((&second.text, &second.tokens), (&first.text, &first.tokens));
    assert_eq!(second.outcome.source_inference_id, first.outcome.inference_id);
    assert_eq!(second.outcome.tokens_reused, first.outcome.tokens_computed);
    assert_eq!(second.outcome.similarity, 1.0);
    assert_eq!(second.outcome.stop_reason, first.outcome.stop_reason);

    // Exact-hit latency over gRPC on loopback (client round trip), from memory.
    let mut rtt = Vec::new();
    for _ in 0..20 {
        let hit = c.generate(ask(FRANCE, 16)).await.expect("hit");
        assert_eq!(hit.served_from(), ServedFrom::Exact);
        rtt.push(hit.client_latency);
    }
    rtt.sort();
    eprintln!("exact hit round trip over gRPC: p50 {:?}, max {:?} (model answer took {:.0} ms)", rtt[10], rtt[19], first.outcome.latency_ms);
    assert!(rtt[10] < Duration::from_millis(50), "an exact hit should take milliseconds, took {:?}", rtt[10]);

    // A different max_tokens is a different question for the exact cache; the semantic tier
    // offers the same question's answer as a draft, which the model checks (VERIFIED).
    let other = c.generate(ask(FRANCE, 15)).await.expect("other key");
    assert_eq!(other.served_from(), ServedFrom::Verified);
    assert!(other.outcome.tokens_computed > 0);
    assert_eq!(other.tokens, first.tokens[..first.tokens.len().min(15)]);

    server.stop().await.expect("stop");
    let server = start(server_config_on(m, db)).await;
    let mut c = client(&server).await;
    let after = c.generate(ask(FRANCE, 16)).await.expect("after restart");
    assert_eq!(after.served_from(), ServedFrom::Exact, "the hit must survive a restart");
    assert_eq!((after.outcome.tokens_computed, &after.text, &after.tokens), (0, &first.text, &first.tokens));
    assert_eq!(after.outcome.source_inference_id, first.outcome.inference_id);
    server.stop().await.expect("stop");
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM inferences"), 24);
}

on_both_models!(exact_hits_even_after_a_restart, super::a_repeat_is_an_exact_hit_even_after_a_restart);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_writes_nothing_and_refresh_supersedes() {
    let (scratch, server, mut c) = service().await;
    let db = &scratch.db;
    let q = "Name the largest planet in the solar system.";

    let b1 = c.generate(with_mode(ask(q, 12), CacheMode::Bypass)).await.expect("bypass 1");
    let b2 = c.generate(with_mode(ask(q, 12), CacheMode::Bypass)).await.expect("bypass 2");
    for b in [&b1, &b2] {
        assert_eq!(b.served_from(), ServedFrom::Model);
        assert!(b.outcome.tokens_computed > 0);
    }
    assert_eq!(b1.text, b2.text);
    // Logged, but nothing cached or learned.
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM inferences WHERE cache_mode = 'bypass' AND cache_key IS NULL"), 2);
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM facts") + sql_i64(db, "SELECT COUNT(*) FROM reasoning_chains"), 0);

    let a = c.generate(ask(q, 12)).await.expect("auto");
    assert_eq!(a.served_from(), ServedFrom::Model, "BYPASS must not have filled the cache");
    let hit = c.generate(ask(q, 12)).await.expect("hit");
    assert_eq!((hit.served_from(), hit.outcome.source_inference_id), (ServedFrom::Exact, a.outcome.inference_id));
    let facts = sql_i64(db, "SELECT COUNT(*) FROM facts");
    assert!(facts > 0, "a computed AUTO answer leaves facts");

    let r = c.generate(with_mode(ask(q, 12), CacheMode::Refresh)).await.expect("refresh");
    assert_eq!(r.served_from(), ServedFrom::Model);
    assert!(r.outcome.tokens_computed > 0, "REFRESH recomputes");
    assert_eq!(r.text, a.text);
    let superseded = sql_i64(db, &format!("SELECT superseded_by FROM inferences WHERE id = {}", a.outcome.inference_id));
    assert_eq!(superseded, r.outcome.inference_id);
    let after = c.generate(ask(q, 12)).await.expect("after refresh");
    assert_eq!((after.served_from(), after.outcome.source_inference_id), (ServedFrom::Exact, r.outcome.inference_id));
    // The recomputed answer restated its claims: stronger facts, no new rows.
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM facts"), facts);
    assert_eq!(sql_i64(db, "SELECT MIN(reuse_count) FROM facts"), 1);
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_without_a_seed_never_use_the_exact_cache() {
    let (scratch, server, mut c) = service().await;
    let db = &scratch.db;
    let mut hot = ask("Tell me a fun fact.", 6);
    hot.temperature = Some(0.9);
    // Computed every time: by the model alone, or with an earlier answer as a draft that the
    // speculative-sampling rule checked (PARTIAL / VERIFIED keep the sampling distribution).
    let computed = |r: &forge_cache::server::client::Generated| {
        matches!(r.served_from(), ServedFrom::Model | ServedFrom::Partial | ServedFrom::Verified) && r.outcome.tokens_computed > 0
    };
    for _ in 0..2 {
        let r = c.generate(hot.clone()).await.expect("sampled");
        assert!(computed(&r), "unseeded sampled request served from {:?}", r.served_from());
    }
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM inferences WHERE cache_key IS NOT NULL"), 0);
    hot.seed = Some(42);
    let s1 = c.generate(hot.clone()).await.expect("seeded");
    let s2 = c.generate(hot.clone()).await.expect("seeded again");
    assert!(computed(&s1), "first seeded request served from {:?}", s1.served_from());
    assert_eq!(s2.served_from(), ServedFrom::Exact);
    assert_eq!(s1.text, s2.text);
    server.stop().await.expect("stop");

    // --no-cache: every request is computed.
    let mut config = server_config(db);
    config.cache = false;
    let server = start(config).await;
    let mut c = client(&server).await;
    assert_eq!(c.generate(hot).await.expect("no cache").served_from(), ServedFrom::Model);
    server.stop().await.expect("stop");
}

/// Batch invariance over the service: greedy (and seeded) answers are identical whether a
/// request ran alone or shared forward passes with others, including a long prompt whose
/// chunked prefill interleaves with the others' decoding.
async fn concurrent_requests_get_their_solo_answers(m: RealModel) {
    let (_scratch, server, mut c) = service_on(m).await;
    let long = format!("Summarize this in one sentence: {}", "The river flows past the old mill and the children play by the water. ".repeat(12));
    let mut seeded = ask("Write a word that rhymes with cat.", 8);
    (seeded.temperature, seeded.top_p, seeded.seed) = (Some(0.8), Some(0.95), Some(7));
    let requests = vec![ask(common::FRANCE, 10), ask("List three colors.", 14), ask(&long, 6), seeded, ask("What is 2 + 2?", 8)];
    let requests: Vec<_> = requests.into_iter().map(|r| with_mode(r, CacheMode::Bypass)).collect();

    let mut solo = Vec::new();
    for r in &requests {
        let g = c.generate(r.clone()).await.expect("solo");
        assert_eq!(g.outcome.peak_batch, 1, "solo runs are alone");
        solo.push(g);
    }
    let tasks: Vec<_> = requests
        .iter()
        .map(|r| {
            let (mut c, r) = (c.clone(), r.clone());
            tokio::spawn(async move { c.generate(r).await.expect("concurrent") })
        })
        .collect();
    let mut peak = 0;
    for (task, alone) in tasks.into_iter().zip(&solo) {
        let together = task.await.expect("join");
        assert_eq!(together.tokens, alone.tokens, "tokens differ for {:?}", alone.text);
        assert_eq!(together.text, alone.text);
        peak = peak.max(together.outcome.peak_batch);
    }
    assert!(peak >= 3, "the requests should have shared forward passes (peak batch {peak})");
    server.stop().await.expect("stop");

    // And the service's answers are the offline generation loop's, token for token (the long
    // prompt went through the scheduler's 64-token prefill chunks).
    let model = m.load();
    let mut state = model.new_state(512);
    let tok = forge_cache::engine::tokenizer::Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    for (r, served) in requests.iter().zip(&solo) {
        let params = forge_cache::engine::generate::GenerateParams {
            max_tokens: r.max_tokens.expect("set") as usize,
            sampling: forge_cache::engine::sampler::SamplingParams {
                temperature: r.temperature.unwrap_or(0.0),
                top_k: r.top_k as usize,
                top_p: r.top_p.unwrap_or(1.0),
                seed: r.seed,
            },
            stop_ids: tok.stop_ids().to_vec(),
        };
        let offline = forge_cache::engine::generate::generate(&model, &mut state, &served.outcome.prompt_token_ids, &params, |_| {
            std::ops::ControlFlow::Continue(())
        })
        .expect("offline");
        assert_eq!(offline.tokens, served.tokens, "service and offline differ for {:?}", served.text);
    }
}

on_both_models!(concurrent_requests_solo_answers, super::concurrent_requests_get_their_solo_answers);
