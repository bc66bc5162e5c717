//! EQUIVALENT over gRPC on the real model, embedder and a real SQLite file: a neighbour's answer
//! is scored by the model under the new prompt (one teacher-forced pass); nothing is served
//! before the run-time evidence (fresh answers decoded after unserved checks) makes a region of
//! scores safe; then a paraphrase gets the stored answer without decoding. Never across tenants
//! or system prompts. VERIFIED's draft skipping keeps outputs identical to BYPASS.

mod common;

use common::*;
use forge_cache::server::proto::{self, CacheMode, ServedFrom};

fn served(o: &proto::Outcome) -> ServedFrom {
    ServedFrom::try_from(o.served_from).expect("served_from")
}

const Q: &str = "What is the capital of France?";

/// Questions the model answers like `Q` (trivial rewrites: the fresh answers show the model's
/// own judgement of the stored one).
const VARIANTS: [&str; 8] = [
    "What is the capital of France ?",
    "what is the capital of France?",
    "What is the capital of France??",
    "What is the capital of France?!",
    "What is the capital of France? ",
    " What is the capital of France?",
    "What is the capital of france?",
    "What is the capital of  France?",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equivalent_serves_a_paraphrase_only_after_learning() {
    // delta 0.3 at 95%: 7 acceptable observations with none rejected above them make a region.
    let (s, server, mut c) = service_with(|cfg, _| {
        cfg.semantic.equivalent.delta = 0.3;
        cfg.semantic.equivalent.explore = 0.0;
    })
    .await;
    let first = c.generate(ask(Q, 24)).await.expect("first");
    assert_eq!(served(&first.outcome), ServedFrom::Model);
    // The answer's log-probabilities are recorded with it.
    let stop = i64::from(first.outcome.stop_reason == proto::StopReason::Stop as i32);
    assert_eq!(
        sql_i64(&s.db, &format!("SELECT length(response_logprobs) / 4 FROM inferences WHERE id = {}", first.outcome.inference_id)),
        first.outcome.completion_tokens as i64 + stop
    );

    let mut served_eq = None;
    for (i, v) in VARIANTS.iter().enumerate() {
        let expected = c.generate(with_mode(ask(v, 24), CacheMode::Bypass)).await.expect("bypass").text;
        let r = c.generate(with_mode(ask(v, 24), CacheMode::Equivalent)).await.expect("equivalent");
        let o = &r.outcome;
        assert_eq!(o.equivalence_checks, 1, "{v:?}: the nearest answer was scored: {o:?}");
        let observations = sql_i64(&s.db, "SELECT count(*) FROM equivalence_outcomes");
        if served(o) == ServedFrom::Equivalent {
            assert!(observations >= 7, "served only after learning ({observations} observations)");
            assert!(o.source_inference_id > 0 && o.tokens_computed > 0 && o.draft_tokens == 0, "{o:?}");
            let source: String = sql_value(&s.db, &format!("SELECT response FROM inferences WHERE id = {}", o.source_inference_id))
                .as_str()
                .expect("text")
                .to_string();
            assert_eq!(r.text, source, "the stored answer, as it was");
            served_eq = Some(i);
            break;
        }
        // Not served: the model's own answer (identical to BYPASS), and one more observation.
        assert_eq!(r.text, expected, "{v:?}: unserved EQUIVALENT answers are the model's own");
        assert_eq!(observations, i as i64 + 1);
        // The check computed the prompt once: its KV (published by the scoring job) is loaded
        // by the generation that followed, all but the last token.
        assert_eq!(o.kv_tokens_reused as usize + 1, o.prompt_token_ids.len(), "{v:?}: the check's prompt KV is reused: {o:?}");
        assert!(o.equivalence_mean_margin.is_finite() && o.equivalence_worst_margin <= o.equivalence_mean_margin + 1e-6);
    }
    let at = served_eq.expect("after enough acceptable observations a paraphrase is served without decoding");
    assert!(at >= 7, "nothing was served before the evidence existed");
    assert_eq!(sql_i64(&s.db, "SELECT equivalent FROM v_semantic WHERE tenant = 'default'"), 1);

    // Another tenant or system prompt: no neighbour, nothing scored, nothing served.
    let mut other = client(&server).await.with_tenant("someone-else");
    let o = other.generate(with_mode(ask(VARIANTS[0], 24), CacheMode::Equivalent)).await.expect("tenant").outcome;
    assert_eq!((o.equivalence_checks, served(&o)), (0, ServedFrom::Model), "never across tenants");
    let mut pirate = with_mode(ask(VARIANTS[0], 24), CacheMode::Equivalent);
    pirate.system = "You are a pirate. Answer like one.".into();
    let o = c.generate(pirate).await.expect("scope").outcome;
    assert_eq!((o.equivalence_checks, served(&o)), (0, ServedFrom::Model), "never across scopes");
    // Other modes never serve EQUIVALENT.
    let o = c.generate(ask(VARIANTS[1], 24)).await.expect("auto").outcome;
    assert_ne!(served(&o), ServedFrom::Equivalent);
    assert_eq!(o.equivalence_checks, 0);
    server.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_skips_drafts_where_they_do_not_pay_and_outputs_stay_bypass() {
    let (s, server, mut c) = service_with(|cfg, _| {
        cfg.semantic.skip.explore = 0.0;
    })
    .await;
    let first = c.generate(ask(Q, 24)).await.expect("first");
    // Evidence: 9+ checks in every similarity band from 0.5 up that accepted nothing, each of 64
    // draft tokens, so that the outcomes the servers below replay (up to 24 accepted tokens each,
    // at similarities near 1.0 for the case variants) cannot lift a band over the floor.
    {
        let conn = rusqlite::Connection::open(&s.db).expect("db");
        for i in 0..200 {
            conn.execute(
                "INSERT INTO semantic_outcomes (tenant, model_id, inference_id, source_inference_id, similarity, draft_tokens, accepted_tokens, correct)
                 SELECT 'default', model_id, id, id, ?2, 64, 0, 0 FROM inferences WHERE id = ?1",
                rusqlite::params![first.outcome.inference_id, 0.5 + (i % 22) as f64 * 0.025 + 0.001],
            )
            .expect("outcome");
        }
    }
    server.stop().await.expect("stop");
    // Every request looks up (the exploring share at 1): the question is filed, the drafts
    // replayed.
    let server = start({
        let mut cfg = server_config(&s.db);
        cfg.semantic.skip.explore = 0.0;
        cfg.semantic.skip.lookup_explore = 1.0;
        cfg
    })
    .await;
    let mut c = client(&server).await;
    for v in &VARIANTS[..3] {
        let expected = c.generate(with_mode(ask(v, 24), CacheMode::Bypass)).await.expect("bypass").text;
        let r = c.generate(with_mode(ask(v, 24), CacheMode::Verified)).await.expect("verified");
        assert_eq!(r.text, expected, "{v:?}: skipping changes no output");
        assert_eq!(r.outcome.draft_tokens, 0, "{v:?}: drafts skipped in a band that never paid: {:?}", r.outcome);
        // The skipped drafts were replayed on the answer: an outcome as if they had been checked.
        let id = r.outcome.inference_id;
        let row = |col: &str| sql_i64(&s.db, &format!("SELECT {col} FROM semantic_outcomes WHERE inference_id = {id}"));
        assert_eq!(row("count(*)"), 1, "{v:?}: one replayed outcome");
        // Accepted counts the stop, which is checked but never fed (as the engine counts).
        assert!(row("draft_tokens") > 0 && row("accepted_tokens") <= row("draft_tokens") + 1, "{v:?}: replayed counts");
        // TRUST still gets its checks (it learns from them).
        let t = c.generate(with_mode(ask(&format!("{v} "), 24), CacheMode::Trust)).await.expect("trust");
        assert!(t.outcome.draft_tokens > 0, "TRUST is never skipped");
    }
    server.stop().await.expect("stop");
    // Half of the requests look up: the others skip the semantic tier (decoded as BYPASS,
    // nothing filed, no replay, no log-probabilities); TRUST still looks up.
    let server = start({
        let mut cfg = server_config(&s.db);
        cfg.semantic.skip.explore = 0.0;
        cfg.semantic.skip.lookup_explore = 0.5;
        cfg
    })
    .await;
    let mut c = client(&server).await;
    let mut looked = Vec::new();
    for v in &VARIANTS[3..7] {
        let expected = c.generate(with_mode(ask(v, 24), CacheMode::Bypass)).await.expect("bypass").text;
        let r = c.generate(with_mode(ask(v, 24), CacheMode::Verified)).await.expect("verified");
        assert_eq!(r.text, expected, "{v:?}: skipping the lookup changes no output");
        assert_eq!(r.outcome.draft_tokens, 0, "{v:?}: {:?}", r.outcome);
        let id = r.outcome.inference_id;
        let n = |sql: &str| sql_i64(&s.db, &sql.replace("ID", &id.to_string()));
        let (filed, replayed) = (n("SELECT count(*) FROM prompt_vectors WHERE inference_id = ID"), n("SELECT count(*) FROM semantic_outcomes WHERE inference_id = ID"));
        assert_eq!(filed, replayed, "{v:?}: a request that looks up is filed and replayed, else neither");
        assert_eq!(n("SELECT response_logprobs IS NOT NULL FROM inferences WHERE id = ID"), filed, "{v:?}: log-probabilities only for a filed answer");
        looked.push(filed);
        let t = c.generate(with_mode(ask(&format!("{v} "), 24), CacheMode::Trust)).await.expect("trust");
        assert!(t.outcome.draft_tokens > 0, "TRUST is never skipped");
    }
    assert_eq!(looked, vec![0, 1, 0, 1], "every second request looks up");
    server.stop().await.expect("stop");
    // The same evidence with skipping off: drafts offered again, same outputs.
    let server = start({
        let mut cfg = server_config(&s.db);
        cfg.semantic.skip.enabled = false;
        cfg
    })
    .await;
    let mut c = client(&server).await;
    let expected = c.generate(with_mode(ask(VARIANTS[7], 24), CacheMode::Bypass)).await.expect("bypass").text;
    let r = c.generate(with_mode(ask(VARIANTS[7], 24), CacheMode::Verified)).await.expect("verified");
    assert_eq!(r.text, expected);
    assert!(r.outcome.draft_tokens > 0);
    server.stop().await.expect("stop");
}
