//! The semantic tier over gRPC on the real model, embedder and a real SQLite file: a similar
//! earlier question's answer is a draft the model checks, so the served text is always the
//! BYPASS text (paraphrases and near-misses alike); neighbours never cross tenants or system
//! prompts; TRUST serves without the model only with enough evidence, and never an answer that
//! verification found wrong for a question at least as similar.

mod common;

use common::*;
use forge_cache::server::proto::{self, CacheMode, ServedFrom};

async fn bypass(c: &mut forge_cache::server::client::Client, q: &str, max: u32) -> String {
    c.generate(with_mode(ask(q, max), CacheMode::Bypass)).await.expect("bypass").text
}

fn served(o: &proto::Outcome) -> ServedFrom {
    ServedFrom::try_from(o.served_from).expect("served_from")
}

async fn verified_reuse_serves_exactly_the_uncached_text(m: RealModel) {
    let (s, server, mut c) = service_on(m).await;
    let pairs = [
        ("What is the capital of France?", "What's the capital city of France?"),
        ("Is the clinic open on Sundays?", "Is the clinic closed on Sundays?"),
        ("How do I boil an egg?", "How can I boil eggs?"),
    ];
    let mut accepted = 0;
    for (first, second) in pairs {
        let a = c.generate(ask(first, 40)).await.expect("first");
        assert_eq!(served(&a.outcome), ServedFrom::Model);
        let expected = bypass(&mut c, second, 40).await;
        let b = c.generate(ask(second, 40)).await.expect("second");
        assert_eq!(b.text, expected, "{second:?}: the served text is the model's own");
        let o = &b.outcome;
        assert!(o.draft_tokens > 0 && o.candidates_tried >= 1, "{second:?}: the neighbour was offered as a draft: {o:?}");
        assert_eq!(o.source_inference_id == a.outcome.inference_id, served(o) != ServedFrom::Model, "{o:?}");
        assert!(o.similarity > 0.5 || served(o) == ServedFrom::Model);
        accepted += o.draft_tokens_accepted;
        // A VERIFIED answer is the whole draft; PARTIAL a prefix of it.
        match served(o) {
            ServedFrom::Verified => assert_eq!(b.text, a.text),
            ServedFrom::Partial => assert!(o.draft_tokens_accepted > 0 && b.text != a.text),
            ServedFrom::Model => assert_eq!(o.draft_tokens_accepted, 0),
            other => panic!("unexpected tier {other:?}"),
        }
    }
    assert!(accepted > 0, "some draft tokens were accepted across the pairs");

    // The same question under another system prompt or tenant has no neighbour.
    let mut other_system = ask("What's the capital city of France?", 40);
    other_system.system = "You are a pirate. Answer like one.".into();
    let o = c.generate(other_system).await.expect("other system").outcome;
    assert_eq!(o.draft_tokens, 0, "another system prompt is another scope");
    let mut other_tenant = client(&server).await.with_tenant("someone-else");
    let o = other_tenant.generate(ask("What's the capital city of France?", 40)).await.expect("tenant").outcome;
    assert_eq!(o.draft_tokens, 0, "neighbours never cross tenants");

    // Every computed answer got an embedding; every check left an outcome; the view adds up.
    assert!(sql_i64(&s.db, "SELECT count(*) FROM prompt_vectors") >= 6);
    assert_eq!(sql_i64(&s.db, "SELECT count(*) FROM semantic_outcomes WHERE tenant = 'default'"), 3);
    assert_eq!(sql_i64(&s.db, "SELECT SUM(draft_accepted) FROM v_semantic WHERE tenant = 'default'"), accepted as i64);

    // The facts of every computed answer get embedded once the service is idle (in the
    // background, `cache::indexer`): none is lost, none is embedded twice.
    let facts = sql_i64(&s.db, "SELECT count(*) FROM facts");
    assert!(facts > 0, "the answers left facts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while sql_i64(&s.db, "SELECT count(*) FROM fact_vectors") < facts && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sql_i64(&s.db, "SELECT count(*) FROM fact_vectors"), facts, "every fact embedded, once");
    server.stop().await.expect("stop");
}

on_both_models!(verified_reuse, super::verified_reuse_serves_exactly_the_uncached_text);

async fn trust_needs_evidence_and_respects_what_verification_found(m: RealModel) {
    let (s, server, mut c) = service_on(m).await;
    let first = c.generate(ask("What is the capital of France?", 40)).await.expect("first");
    let paraphrase = "What is the capital of France ?";
    // No evidence yet: TRUST falls back to verification.
    let o = c.generate(with_mode(ask(paraphrase, 40), CacheMode::Trust)).await.expect("trust").outcome;
    assert_ne!(served(&o), ServedFrom::Trust);
    server.stop().await.expect("stop");

    // Evidence: 300 correct checks of other answers at similarity 0.5-0.98 (written straight into
    // the store, as if earlier verifications had found them), and a restart to load it.
    {
        let conn = rusqlite::Connection::open(&s.db).expect("db");
        // What the check above found depends on the model (Gemma 3 answers the paraphrase
        // differently, a wrong outcome that alone keeps TRUST off): the evidence here is written.
        conn.execute("DELETE FROM semantic_outcomes", []).expect("clear outcomes");
        let id = first.outcome.inference_id;
        for i in 0..300 {
            conn.execute(
                "INSERT INTO semantic_outcomes (tenant, model_id, inference_id, source_inference_id, similarity, draft_tokens, accepted_tokens, correct)
                 SELECT 'default', model_id, ?1, ?1, ?2, 10, 10, 1 FROM inferences WHERE id = ?1",
                rusqlite::params![id + 1, 0.5 + i as f64 * 1.6e-3],
            )
            .expect("outcome");
        }
        let _ = id;
    }
    let server = start(server_config_on(m, &s.db)).await;
    let mut c = client(&server).await;
    let question = "What is the capital city of France?";
    let expected = bypass(&mut c, question, 40).await;
    let t = c.generate(with_mode(ask(question, 40), CacheMode::Trust)).await.expect("trust");
    assert_eq!(served(&t.outcome), ServedFrom::Trust, "{:?}", t.outcome);
    assert_eq!(t.outcome.tokens_computed, 0);
    assert_eq!(t.text, first.text, "TRUST serves the neighbour's answer");
    assert!(t.outcome.similarity >= 0.5);
    // Whether that was right is what the false-hit rate measures (forge-cache ab); here:
    eprintln!("trusted answer == model's answer: {}", t.text == expected);

    // The neighbour's answer found wrong at a higher similarity: never trusted below it.
    {
        let conn = rusqlite::Connection::open(&s.db).expect("db");
        conn.execute(
            "INSERT INTO semantic_outcomes (tenant, model_id, inference_id, source_inference_id, similarity, draft_tokens, accepted_tokens, correct)
             SELECT 'default', model_id, id, ?1, 0.9999, 10, 3, 0 FROM inferences WHERE id = ?1",
            [first.outcome.inference_id],
        )
        .expect("wrong outcome");
    }
    let o = c.generate(with_mode(ask("Which city is the capital of France?", 40), CacheMode::Trust)).await.expect("trust").outcome;
    assert_ne!(served(&o), ServedFrom::Trust, "a vetoed answer is verified instead: {o:?}");
    server.stop().await.expect("stop");
}

on_both_models!(trust_needs_evidence, super::trust_needs_evidence_and_respects_what_verification_found);
