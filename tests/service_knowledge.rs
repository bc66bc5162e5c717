//! The knowledge store through the service: facts from answers (dedup, strengthening, chains),
//! PutFact superseding and answering (FACT), InvalidateFacts, tenants that never see each
//! other's answers or facts, GetStats; then the command line on the same database:
//! `generate --server --json`, `stats`, `sql` (writes refused), and every example query of
//! docs/schema.md.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ask, service, service_on, sql_i64, with_mode, RealModel, FRANCE};
use forge_cache::server::proto::{self, CacheMode, ServedFrom};

async fn answers_leave_facts_that_users_can_correct(m: RealModel) {
    let (scratch, server, mut c) = service_on(m).await;
    let db = &scratch.db;

    let g = c.generate(ask(FRANCE, 24)).await.expect("model answer");
    assert_eq!(g.served_from(), ServedFrom::Model);
    let facts = c.search_facts("", false).await.expect("search");
    assert!(!facts.is_empty(), "the answer {:?} left no facts", g.text);
    for f in &facts {
        assert!(g.text.contains(&f.content), "{:?} is not a claim of {:?}", f.content, g.text);
        assert_eq!((f.source_type.as_str(), f.provenance_inference_id, f.confidence, f.live), ("inference", g.outcome.inference_id, 0.5, true));
        assert_eq!(f.question, FRANCE);
    }
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM reasoning_chains"), 1);

    // Recomputing the same answer strengthens the same facts; replaying it reuses the chain.
    c.generate(with_mode(ask(FRANCE, 24), CacheMode::Refresh)).await.expect("refresh");
    let again = c.search_facts("", false).await.expect("search");
    assert_eq!(again.iter().map(|f| f.id).collect::<Vec<_>>(), facts.iter().map(|f| f.id).collect::<Vec<_>>());
    assert!(again.iter().all(|f| f.confidence == 0.75 && f.reuse_count == 1), "{again:?}");
    assert_eq!(c.generate(ask(FRANCE, 24)).await.expect("hit").served_from(), ServedFrom::Exact);
    assert_eq!(sql_i64(db, "SELECT reuse_count FROM reasoning_chains"), 2);

    // A user-provided fact about the question supersedes the model's and answers it.
    let truth = "Paris is the capital of France, on the Seine.";
    let put = c
        .put_fact(proto::PutFactRequest { content: truth.into(), question: FRANCE.into(), ..Default::default() })
        .await
        .expect("put");
    let user_fact = put.fact.expect("fact");
    assert_eq!((user_fact.source_type.as_str(), user_fact.confidence), ("user_provided", 1.0));
    let mut model_ids: Vec<i64> = facts.iter().map(|f| f.id).collect();
    model_ids.sort_unstable();
    let mut superseded = put.superseded_ids.clone();
    superseded.sort_unstable();
    assert_eq!(superseded, model_ids);
    let all = c.search_facts("", true).await.expect("search all");
    for f in all.iter().filter(|f| model_ids.contains(&f.id)) {
        assert!(!f.live && f.degraded_by == user_fact.id, "{f:?}");
        assert!(f.degradation_reason.contains("superseded by user-provided fact"), "{f:?}");
    }
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM facts"), model_ids.len() as i64 + 1, "nothing is deleted");
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM fact_relationships WHERE kind = 'supersedes'"), model_ids.len() as i64);

    for question in [FRANCE, "what is the capital of france"] {
        let served = c.generate(ask(question, 24)).await.expect("fact answer");
        assert_eq!(served.served_from(), ServedFrom::Fact, "{question}");
        assert_eq!((served.text.as_str(), served.outcome.source_fact_id, served.outcome.tokens_computed), (truth, user_fact.id, 0));
    }

    // Invalidated, the user fact no longer answers: the cached model answer is back.
    let req = proto::InvalidateFactsRequest { ids: vec![user_fact.id], reason: "testing".into(), ..Default::default() };
    assert_eq!(c.invalidate_facts(req).await.expect("invalidate"), vec![user_fact.id]);
    assert_eq!(c.generate(ask(FRANCE, 24)).await.expect("after").served_from(), ServedFrom::Exact);
    // By text: every live fact mentioning the word.
    c.generate(ask("What is the capital of Italy?", 16)).await.expect("italy");
    let live_before = c.search_facts("capital", false).await.expect("search").len();
    let req = proto::InvalidateFactsRequest { text_match: "CAPITAL".into(), reason: "audit".into(), ..Default::default() };
    assert_eq!(c.invalidate_facts(req).await.expect("by text").len(), live_before);
    assert!(c.search_facts("capital", false).await.expect("search").is_empty());

    let stats = c.get_stats(0).await.expect("stats");
    let tier = |t: ServedFrom| stats.tiers.iter().find(|x| x.served_from == t as i32).map_or(0, |x| x.requests);
    // Three answers were computed; the Italy question may have had part of the France answer
    // accepted as a draft (PARTIAL) depending on the model.
    let computed = tier(ServedFrom::Model) + tier(ServedFrom::Partial) + tier(ServedFrom::Verified);
    assert!(tier(ServedFrom::Model) >= 2);
    assert_eq!((stats.requests, computed, tier(ServedFrom::Exact), tier(ServedFrom::Fact)), (7, 3, 2, 2));
    assert!(stats.tokens_saved > 0 && stats.time_saved_ms > 0.0, "{stats:?}");
    assert_eq!(stats.live_facts + stats.degraded_facts, sql_i64(db, "SELECT COUNT(*) FROM facts") as u64);
    server.stop().await.expect("stop");
}

on_both_models!(facts_users_can_correct, super::answers_leave_facts_that_users_can_correct);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_never_see_each_others_answers_or_facts() {
    let (_scratch, server, base) = service().await;
    let (mut acme, mut globex) = (base.clone().with_tenant("acme"), base.clone().with_tenant("globex"));

    let a1 = acme.generate(ask(FRANCE, 16)).await.expect("acme");
    assert_eq!(acme.generate(ask(FRANCE, 16)).await.expect("acme again").served_from(), ServedFrom::Exact);
    let g1 = globex.generate(ask(FRANCE, 16)).await.expect("globex");
    assert_eq!(g1.served_from(), ServedFrom::Model, "globex must not get acme's cached answer");
    assert_eq!(g1.text, a1.text, "same model, same greedy answer, computed separately");

    let secret = "Acme's internal answer: the capital is Paris.";
    acme.put_fact(proto::PutFactRequest { content: secret.into(), question: FRANCE.into(), ..Default::default() }).await.expect("put");
    assert_eq!(acme.generate(ask(FRANCE, 16)).await.expect("acme fact").text, secret);
    let g2 = globex.generate(ask(FRANCE, 16)).await.expect("globex");
    assert_eq!((g2.served_from(), g2.outcome.source_inference_id), (ServedFrom::Exact, g1.outcome.inference_id));
    assert_ne!(g2.text, secret);

    let acme_facts = acme.search_facts("", true).await.expect("acme facts");
    let globex_facts = globex.search_facts("", true).await.expect("globex facts");
    assert!(globex_facts.iter().all(|f| f.content != secret && acme_facts.iter().all(|a| a.id != f.id)));
    assert!(globex_facts.iter().all(|f| f.live), "acme's PutFact must not degrade globex's facts");

    // Invalidation and stats stay inside the tenant too.
    let req = proto::InvalidateFactsRequest { text_match: "capital".into(), reason: "globex cleanup".into(), ..Default::default() };
    let gone = globex.invalidate_facts(req).await.expect("globex invalidates");
    assert!(gone.iter().all(|id| globex_facts.iter().any(|f| f.id == *id)));
    assert!(acme.search_facts(secret, false).await.expect("acme").iter().any(|f| f.content == secret));
    let foreign = proto::InvalidateFactsRequest { ids: vec![acme_facts[0].id], reason: "x".into(), ..Default::default() };
    assert!(globex.invalidate_facts(foreign).await.is_err(), "globex cannot name acme's facts");
    assert_eq!((acme.get_stats(0).await.expect("s").requests, globex.get_stats(0).await.expect("s").requests), (3, 2));
    server.stop().await.expect("stop");
}

fn cli(args: &[&str], db: &Path) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_forge-cache")).args(args).arg("--db").arg(db).output().expect("run forge-cache");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_reads_the_real_database() {
    let (scratch, server, mut c) = service().await;
    let db = &scratch.db;

    // generate --server --json, twice: computed, then an exact hit.
    let url = server.url();
    let run = move || {
        let out = Command::new(env!("CARGO_BIN_EXE_forge-cache"))
            .args(["generate", "--server", &url, "--tenant", "cli", "--max-tokens", "12", "--json", "--system", common::SYSTEM, "--prompt", FRANCE])
            .output()
            .expect("generate --server");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("one JSON object")
    };
    let first = tokio::task::spawn_blocking(run.clone()).await.expect("join");
    let second = tokio::task::spawn_blocking(run).await.expect("join");
    assert_eq!((first["served_from"].as_str(), second["served_from"].as_str()), (Some("MODEL"), Some("EXACT")));
    assert_eq!((second["tokens_computed"].as_u64(), second["similarity"].as_f64()), (Some(0), Some(1.0)));
    assert_eq!(second["source_inference_id"], first["inference_id"]);
    assert_eq!((&second["text"], &second["tokens"]), (&first["text"], &first["tokens"]));
    for key in ["prompt_tokens", "prefill_tok_s", "decode_tok_s", "stop_reason", "tokens_reused", "latency_ms"] {
        assert!(!second[key].is_null(), "{key} missing from {second}");
    }
    c.generate(ask("Name a primary color.", 8)).await.expect("more traffic");

    // stats
    let (ok, out, err) = cli(&["stats", "--json", "--since", "1h"], db);
    assert!(ok, "{err}");
    let stats: serde_json::Value = serde_json::from_str(&out).expect("stats JSON");
    let total = stats.as_array().and_then(|a| a.last()).expect("a total row");
    assert_eq!((total["tenant"].as_str(), total["requests"].as_u64()), (Some("*"), Some(3)));
    let (ok, out, err) = cli(&["stats"], db);
    assert!(ok && out.contains("EXACT") && out.contains("tokens saved"), "{out}{err}");

    // sql: reads in three formats; writes refused, the file unchanged.
    let (ok, out, _) = cli(&["sql", "--csv", "SELECT served_from, COUNT(*) AS n FROM inferences GROUP BY 1 ORDER BY 1"], db);
    assert!(ok);
    assert_eq!(out, "served_from,n\nEXACT,1\nMODEL,2\n");
    let (ok, out, _) = cli(&["sql", "--json", "SELECT tenant FROM inferences ORDER BY id LIMIT 1"], db);
    assert!(ok);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).expect("json")["rows"][0][0], "cli");
    let (ok, out, _) = cli(&["sql", "SELECT COUNT(*) AS facts FROM v_live_facts"], db);
    assert!(ok && out.starts_with("facts"), "{out}");
    let before = sql_i64(db, "SELECT COUNT(*) FROM inferences");
    for write in [
        "INSERT INTO facts (tenant, content, content_norm, confidence, source_type) VALUES ('x', 'y', 'y', 1, 'deduced')",
        "UPDATE inferences SET tenant = 'x'",
        "DELETE FROM inferences",
        "DROP TABLE facts",
        "ATTACH DATABASE 'other.db' AS other",
    ] {
        let (ok, _, err) = cli(&["sql", write], db);
        assert!(!ok, "{write} must fail");
        assert!(err.contains("refused") && err.contains("only reads"), "{write}: {err}");
    }
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM inferences"), before);
    assert_eq!(sql_i64(db, "SELECT COUNT(*) FROM facts WHERE tenant = 'x'"), 0);

    // Every example in docs/schema.md runs, and every table and view is documented there.
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schema.md")).expect("docs/schema.md");
    let blocks: Vec<&str> = doc.split("```sql\n").skip(1).map(|b| b.split("```").next().unwrap_or_default()).collect();
    assert!(blocks.len() >= 10, "{} examples", blocks.len());
    let conn = forge_cache::store::query::open_read_only(db).expect("open");
    for q in &blocks {
        forge_cache::store::query::run_read_only(&conn, q, 100).unwrap_or_else(|e| panic!("{q}\n{e}"));
    }
    let names = forge_cache::store::query::run_read_only(&conn, "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')", 100).expect("names");
    for row in names.rows {
        let name = row[0].as_str().expect("name");
        // sqlite-vec's shadow tables are documented with their vec0 table.
        if ["prompt_vectors_", "fact_vectors_", "sqlite_"].iter().any(|p| name.starts_with(p)) {
            continue;
        }
        assert!(doc.contains(&format!("## {name}")) || doc.contains(&format!("`{name}`")), "{name} is not documented");
    }
    server.stop().await.expect("stop");
}
