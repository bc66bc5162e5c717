//! `forge-cache bench-kv --postgres URL`: time to first token on a second replica for a question
//! about a document the first replica computed, with KV blocks per replica (the default on
//! PostgreSQL) and shared (`--kv-storage blob`: `bytea` rows). Four services in this process on
//! one database (two replicas of each kind, semantic tier off so only KV reuse differs); per
//! article and repeat, a fresh tenant (no block, answer or fact of an earlier round can help):
//!
//! * cold: replica A, question 0 (nothing stored: the whole document prefilled);
//! * other replica: replica B, question 1 — per replica it recomputes the document, shared it
//!   loads A's blocks from PostgreSQL;
//! * own memory: replica A, question 1 with REFRESH (no EXACT hit), its own blocks in memory.
//!
//! The two kinds alternate which goes first from one round to the next. Every answer of B is
//! compared with BYPASS (token for token).

use anyhow::bail;

use forge_cache::server::client::{Client, Generated};
use forge_cache::server::proto::CacheMode;
use forge_cache::server::{self, RunningServer, ServerConfig};
use forge_cache::workload::{KvConfig, Storage};

use super::bench_kv::{load_articles, references, request, warmup, Article, BenchKvArgs};

/// One round of one kind on one article.
#[derive(serde::Serialize)]
struct Round {
    article: String,
    kind: &'static str,
    repeat: usize,
    prompt_tokens: usize,
    cold_ttft_ms: f64,
    other_replica_ttft_ms: f64,
    own_memory_ttft_ms: f64,
    other_replica_reused: u32,
    own_memory_reused: u32,
    /// B's answer equals BYPASS's, token for token.
    identical: bool,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_else(|_| "?".into())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

async fn replica(a: &BenchKvArgs, model: &std::path::Path, url: &str, storage: Storage) -> anyhow::Result<RunningServer> {
    let mut c = ServerConfig::new(model, url);
    c.threads = a.threads;
    c.embedder = None;
    c.kv = Some(KvConfig { storage, ..KvConfig::default() });
    let s = server::start(c, "127.0.0.1:0").await?;
    // Each process runs the model once before anything is timed.
    Client::connect(&s.url()).await?.generate(warmup()).await?;
    Ok(s)
}

async fn ask(s: &RunningServer, tenant: &str, art: &Article, q: usize, max_tokens: u32, mode: CacheMode) -> anyhow::Result<Generated> {
    Ok(Client::connect(&s.url()).await?.with_tenant(tenant).generate(request(art, q, max_tokens, mode)).await?)
}

/// Runs the rounds and prints them (one JSON object each with `--json`), then min / median per
/// kind.
/// `bench-kv --postgres URL`: the articles and BYPASS references as bench-kv makes them, then the
/// replica rounds.
pub(super) fn run_cli(a: &BenchKvArgs, url: &str) -> anyhow::Result<()> {
    let (model, arts) = load_articles(a)?;
    super::runtime()?.block_on(async {
        let refs = references(a, &model, &arts).await?;
        run(a, &model, url, &arts, &refs).await
    })
}

async fn run(a: &BenchKvArgs, model: &std::path::Path, url: &str, arts: &[Article], refs: &[Generated]) -> anyhow::Result<()> {
    if !forge_cache::store::is_postgres_url(url) {
        bail!("--postgres takes a postgres:// URL, not {url:?}");
    }
    let load_before = loadavg();
    let kinds = [("per-replica", Storage::File), ("shared", Storage::Blob)];
    let mut servers = Vec::new();
    for (_, storage) in kinds {
        servers.push((replica(a, model, url, storage).await?, replica(a, model, url, storage).await?));
    }
    let mut rounds: Vec<Round> = Vec::new();
    for rep in 0..a.repeats {
        for (i, (art, reference)) in arts.iter().zip(refs).enumerate() {
            for k in 0..kinds.len() {
                let k = (k + rep + i) % kinds.len();
                let (kind, (sa, sb)) = (kinds[k].0, &servers[k]);
                let tenant = format!("bench-kv-{}-{kind}-{i}-{rep}", std::process::id());
                let cold = ask(sa, &tenant, art, 0, a.max_tokens, CacheMode::Auto).await?;
                let other = ask(sb, &tenant, art, 1, a.max_tokens, CacheMode::Auto).await?;
                let own = ask(sa, &tenant, art, 1, a.max_tokens, CacheMode::Refresh).await?;
                let r = Round {
                    article: art.title.clone(),
                    kind,
                    repeat: rep,
                    prompt_tokens: other.outcome.prompt_token_ids.len(),
                    cold_ttft_ms: cold.outcome.ttft_ms,
                    other_replica_ttft_ms: other.outcome.ttft_ms,
                    own_memory_ttft_ms: own.outcome.ttft_ms,
                    other_replica_reused: other.outcome.kv_tokens_reused,
                    own_memory_reused: own.outcome.kv_tokens_reused,
                    identical: other.tokens == reference.tokens,
                };
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    eprintln!(
                        "{} ({} tokens) {kind} #{rep}: cold {:.0} ms, other replica {:.0} ms ({} reused), own memory {:.0} ms ({} reused), identical to BYPASS: {}",
                        r.article, r.prompt_tokens, r.cold_ttft_ms, r.other_replica_ttft_ms, r.other_replica_reused, r.own_memory_ttft_ms, r.own_memory_reused, r.identical
                    );
                }
                rounds.push(r);
            }
        }
    }
    for (sa, sb) in servers {
        sa.stop().await?;
        sb.stop().await?;
    }
    if !a.json {
        println!("load average: {load_before} before, {} after; {} articles x {} repeats per kind", loadavg(), arts.len(), a.repeats);
        println!("kind         rounds  cold ttft ms (min / median)  other replica ttft ms (min / median)  own memory ttft ms (min / median)  cold / other (median)  identical");
        for (kind, _) in kinds {
            let mine: Vec<&Round> = rounds.iter().filter(|r| r.kind == kind).collect();
            let col = |f: &dyn Fn(&Round) -> f64| {
                let v: Vec<f64> = mine.iter().map(|r| f(r)).collect();
                (v.iter().copied().fold(f64::INFINITY, f64::min), median(v))
            };
            let (c, o, m) = (col(&|r| r.cold_ttft_ms), col(&|r| r.other_replica_ttft_ms), col(&|r| r.own_memory_ttft_ms));
            let ratio = median(mine.iter().map(|r| r.cold_ttft_ms / r.other_replica_ttft_ms).collect());
            let same = mine.iter().filter(|r| r.identical).count();
            println!(
                "{kind:<12} {:>6}  {:>12.0} / {:<12.0}  {:>12.0} / {:<12.0}         {:>10.0} / {:<10.0}         {:>8.1}x        {same}/{}",
                mine.len(),
                c.0,
                c.1,
                o.0,
                o.1,
                m.0,
                m.1,
                ratio,
                mine.len()
            );
        }
    }
    Ok(())
}
