//! `forge-cache bench-kv`: time to first token (as the service measures it) for a question about
//! a ~1,000-token document: cold (nothing stored), warm (another question, the document's KV
//! blocks in memory) and after a restart (that same other question, the blocks read from disk),
//! through the real service on loopback; for each disk storage (side file, BLOB) and each
//! requested disk codec. Answers are
//! checked against BYPASS (no reuse): identical for f16, token agreement reported for the lossy
//! codecs. Documents are SQuAD v1.1 dev articles (paragraphs of one article joined until the
//! prompt reaches `--tokens`). With `--postgres URL`: replicas on one database instead, KV
//! blocks per replica against shared (`bench_kv_replicas`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::gguf::GgufFile;
use forge_cache::server::client::{Client, Generated};
use forge_cache::server::proto::{CacheMode, GenerateRequest};
use forge_cache::server::{self, ServerConfig};
use forge_cache::workload::{Codec, KvConfig, Storage};

#[derive(Debug, Args)]
pub struct BenchKvArgs {
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads for the model (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Folder with squad_v1.1_dev_contexts.jsonl and squad_v1.1_dev_questions.jsonl.
    #[arg(long, default_value = "../shared/data/squad")]
    pub squad: PathBuf,
    /// Articles (documents) to measure.
    #[arg(long, default_value_t = 3)]
    pub articles: usize,
    /// Prompt length to reach, in tokens.
    #[arg(long, default_value_t = 1000)]
    pub tokens: usize,
    /// Disk storages to measure with f16 (file, blob).
    #[arg(long, value_delimiter = ',', default_value = "file,blob")]
    pub storages: Vec<String>,
    /// Disk codecs to measure (f16 always first).
    #[arg(long, value_delimiter = ',', default_value = "f16")]
    pub codecs: Vec<String>,
    /// Tokens generated per question.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Print one JSON object per measurement instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Measure replicas on this PostgreSQL database instead: a second replica's TTFT with KV
    /// blocks per replica and shared (`--kv-storage blob`); --storages and --codecs are unused.
    #[arg(long)]
    pub postgres: Option<String>,
    /// Rounds per article (with --postgres).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Serve without the semantic tier (no question embedding, no drafts from an earlier answer to
    /// the same document): TTFT is then KV reuse alone.
    #[arg(long)]
    pub no_semantic: bool,
}

pub(super) struct Article {
    /// The SQuAD article's title.
    pub(super) title: String,
    doc: String,
    questions: Vec<String>,
}

fn read_jsonl(path: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines().filter(|l| !l.trim().is_empty()).map(|l| Ok(serde_json::from_str(l)?)).collect()
}

/// Articles whose joined paragraphs reach `tokens` (chat-rendered) with three questions.
fn articles(a: &BenchKvArgs, tok: &Tokenizer) -> anyhow::Result<Vec<Article>> {
    let contexts = read_jsonl(&a.squad.join("squad_v1.1_dev_contexts.jsonl"))?;
    let questions = read_jsonl(&a.squad.join("squad_v1.1_dev_questions.jsonl"))?;
    let s = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let mut out: Vec<Article> = Vec::new();
    let mut cur: Option<(Article, Vec<String>)> = None;
    let mut done: Vec<String> = Vec::new();
    for c in &contexts {
        let title = s(c, "title");
        if cur.as_ref().is_some_and(|(art, _)| art.title != title) {
            cur = None;
        }
        if done.contains(&title) {
            continue; // one document per article
        }
        let (art, ids) = cur.get_or_insert_with(|| (Article { title: title.clone(), doc: String::new(), questions: Vec::new() }, Vec::new()));
        if !art.doc.is_empty() {
            art.doc.push_str("\n\n");
        }
        art.doc.push_str(&s(c, "context"));
        ids.push(s(c, "context_id"));
        if tok.encode(&art.doc, false)?.len() + 40 >= a.tokens {
            let (mut art, ids) = cur.take().expect("set above");
            done.push(art.title.clone());
            art.questions = questions.iter().filter(|q| ids.contains(&s(q, "context_id"))).map(|q| s(q, "question")).take(3).collect();
            if art.questions.len() == 3 {
                out.push(art);
            }
            if out.len() == a.articles {
                break;
            }
        }
    }
    if out.len() < a.articles {
        bail!("only {} articles reach {} tokens", out.len(), a.tokens);
    }
    Ok(out)
}

pub(super) fn request(art: &Article, q: usize, max_tokens: u32, mode: CacheMode) -> GenerateRequest {
    GenerateRequest {
        prompt: format!("{}\n\nQuestion: {}", art.doc, art.questions[q]),
        system: "Answer the question from the document.".into(),
        max_tokens: Some(max_tokens),
        cache_mode: mode as i32,
        ..Default::default()
    }
}

#[derive(serde::Serialize)]
struct Measured {
    article: String,
    storage: &'static str,
    codec: &'static str,
    prompt_tokens: usize,
    cold_ttft_ms: f64,
    warm_ttft_ms: f64,
    disk_ttft_ms: f64,
    warm_reused: u32,
    disk_reused: u32,
    /// Prompt tokens computed (warm, after restart).
    warm_computed: usize,
    disk_computed: usize,
    /// Reading the blocks from disk (inside the restart's TTFT).
    disk_load_ms: f64,
    /// Writing the cold request's blocks (after its answer).
    store_ms: f64,
    /// Leading generated tokens equal to BYPASS's (warm, after restart), as a fraction.
    warm_agreement: f64,
    disk_agreement: f64,
}

fn agreement(a: &Generated, reference: &Generated) -> f64 {
    let n = a.tokens.len().max(reference.tokens.len()).max(1);
    a.tokens.iter().zip(&reference.tokens).take_while(|(x, y)| x == y).count() as f64 / n as f64
}

fn kv_row(db: &std::path::Path, id: i64) -> anyhow::Result<(f64, f64)> {
    let conn = forge_cache::store::query::open_read_only(db)?;
    Ok(conn.query_row("SELECT load_ms, store_ms FROM kv_requests WHERE inference_id = ?1", [id], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// One (storage, codec) on one article. Two fresh databases with the same history, so that
/// warm and restart answer the same question with the same stored prefix:
/// A: cold question 0, then question 1 with the blocks in memory;
/// B: cold question 0, restart, then question 1 with the blocks read from disk.
async fn scenario(
    a: &BenchKvArgs,
    model: &std::path::Path,
    art: &Article,
    reference: &Generated,
    storage: Storage,
    codec: Codec,
) -> anyhow::Result<Measured> {
    let config = |db: &std::path::Path| {
        let mut c = ServerConfig::new(model, db);
        c.threads = a.threads;
        c.kv = Some(KvConfig { storage, codec, ..KvConfig::default() });
        if a.no_semantic {
            c.embedder = None;
        }
        c
    };
    // A: cold, then warm.
    let dir_a = Scratch::new("warm")?;
    let db_a = dir_a.0.join("bench.db");
    let s = server::start(config(&db_a), "127.0.0.1:0").await?;
    let mut c = Client::connect(&s.url()).await?;
    let _ = c.generate(warmup()).await?;
    let cold = c.generate(request(art, 0, a.max_tokens, CacheMode::Auto)).await?;
    let warm = c.generate(request(art, 1, a.max_tokens, CacheMode::Auto)).await?;
    s.stop().await?;
    let (_, store_ms) = kv_row(&db_a, cold.outcome.inference_id)?;

    // B: cold, restart, from disk.
    let dir_b = Scratch::new("disk")?;
    let db_b = dir_b.0.join("bench.db");
    let s = server::start(config(&db_b), "127.0.0.1:0").await?;
    let mut c = Client::connect(&s.url()).await?;
    let _ = c.generate(request(art, 0, a.max_tokens, CacheMode::Auto)).await?;
    s.stop().await?;
    let s = server::start(config(&db_b), "127.0.0.1:0").await?;
    let mut c = Client::connect(&s.url()).await?;
    // One unrelated request first, as in A, so that both numbers come from a process that has
    // run the model once.
    let _ = c.generate(warmup()).await?;
    let disk = c.generate(request(art, 1, a.max_tokens, CacheMode::Auto)).await?;
    s.stop().await?;
    let (disk_load_ms, _) = kv_row(&db_b, disk.outcome.inference_id)?;
    Ok(Measured {
        article: art.title.clone(),
        storage: storage.as_str(),
        codec: codec.as_str(),
        prompt_tokens: cold.outcome.prompt_token_ids.len(),
        cold_ttft_ms: cold.outcome.ttft_ms,
        warm_ttft_ms: warm.outcome.ttft_ms,
        disk_ttft_ms: disk.outcome.ttft_ms,
        warm_reused: warm.outcome.kv_tokens_reused,
        disk_reused: disk.outcome.kv_tokens_reused,
        warm_computed: warm.outcome.prompt_token_ids.len() - warm.outcome.kv_tokens_reused as usize,
        disk_computed: disk.outcome.prompt_token_ids.len() - disk.outcome.kv_tokens_reused as usize,
        disk_load_ms,
        store_ms,
        warm_agreement: agreement(&warm, reference),
        disk_agreement: agreement(&disk, reference),
    })
}

/// A fresh folder under the system's temporary folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> std::io::Result<Scratch> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("forge-bench-kv-{}-{what}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn warmup() -> GenerateRequest {
    GenerateRequest { prompt: "Hello.".into(), max_tokens: Some(2), cache_mode: CacheMode::Bypass as i32, ..Default::default() }
}

/// The model and the articles every bench-kv variant starts from.
pub(super) fn load_articles(a: &BenchKvArgs) -> anyhow::Result<(PathBuf, Vec<Article>)> {
    let model = forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?;
    if !model.exists() {
        bail!(forge_cache::models::missing_hint(&model));
    }
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model)?)?;
    let arts = articles(a, &tok)?;
    Ok((model, arts))
}

/// BYPASS answers (no reuse) to each article's question 1: what every reusing run must reproduce.
pub(super) async fn references(a: &BenchKvArgs, model: &std::path::Path, arts: &[Article]) -> anyhow::Result<Vec<Generated>> {
    let dir = Scratch::new("ref")?;
    let mut config = ServerConfig::new(model, dir.0.join("ref.db"));
    config.threads = a.threads;
    config.kv = None;
    let s = server::start(config, "127.0.0.1:0").await?;
    let mut c = Client::connect(&s.url()).await?;
    let mut refs = Vec::new();
    for art in arts {
        refs.push(c.generate(request(art, 1, a.max_tokens, CacheMode::Bypass)).await?);
    }
    s.stop().await?;
    Ok(refs)
}

/// bench-kv on one machine (`--postgres` runs `bench_kv_replicas` instead, dispatched by the CLI).
pub fn run(a: &BenchKvArgs) -> anyhow::Result<()> {
    let codecs: Vec<Codec> = a.codecs.iter().map(|c| Codec::parse(c)).collect::<Result<_, _>>()?;
    let storages: Vec<Storage> = a
        .storages
        .iter()
        .map(|s| match s.as_str() {
            "file" => Ok(Storage::File),
            "blob" => Ok(Storage::Blob),
            other => Err(anyhow::anyhow!("--storages takes file and/or blob, not {other:?}")),
        })
        .collect::<anyhow::Result<_>>()?;
    let (model, arts) = load_articles(a)?;
    let mut rows = Vec::new();
    super::runtime()?.block_on(async {
        // BYPASS references (no reuse) for the warm and the restart questions.
        let refs = references(a, &model, &arts).await?;
        for (art, r) in arts.iter().zip(&refs) {
            let mut runs: Vec<(Storage, Codec)> = storages.iter().map(|&s| (s, Codec::F16)).collect();
            runs.extend(codecs.iter().filter(|&&c| c != Codec::F16).map(|&c| (Storage::File, c)));
            for (storage, codec) in runs {
                let m = scenario(a, &model, art, r, storage, codec).await?;
                if a.json {
                    println!("{}", serde_json::to_string(&m)?);
                } else {
                    eprintln!(
                        "{} ({} tokens) {}/{}: ttft cold {:.0} ms, warm {:.1} ms ({:.1}x, {} reused, {} computed), after restart {:.1} ms ({:.1}x cold, {:.2}x warm, {} reused, {} computed; disk read {:.1} ms); store {:.1} ms; agreement {:.2}/{:.2}",
                        m.article, m.prompt_tokens, m.storage, m.codec, m.cold_ttft_ms, m.warm_ttft_ms, m.cold_ttft_ms / m.warm_ttft_ms, m.warm_reused, m.warm_computed,
                        m.disk_ttft_ms, m.cold_ttft_ms / m.disk_ttft_ms, m.disk_ttft_ms / m.warm_ttft_ms, m.disk_reused, m.disk_computed, m.disk_load_ms, m.store_ms, m.warm_agreement, m.disk_agreement
                    );
                }
                rows.push(m);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        anyhow::Ok(())
    })?;
    if !a.json {
        println!("storage  codec  articles  cold ttft ms  warm ttft ms  restart ttft ms  cold/warm (min)  cold/restart (min)  restart/warm  disk read ms  store ms  agreement (warm, restart; min)");
        let mut keys: Vec<(&str, &str)> = rows.iter().map(|m| (m.storage, m.codec)).collect();
        keys.dedup();
        keys.sort();
        keys.dedup();
        for (storage, codec) in keys {
            let mine: Vec<&Measured> = rows.iter().filter(|m| m.storage == storage && m.codec == codec).collect();
            let mean = |f: &dyn Fn(&Measured) -> f64| mine.iter().map(|m| f(m)).sum::<f64>() / mine.len() as f64;
            let min = |f: &dyn Fn(&Measured) -> f64| mine.iter().map(|m| f(m)).fold(f64::INFINITY, f64::min);
            println!(
                "{storage:<8} {codec:<6} {:>8}  {:>12.0}  {:>12.1}  {:>15.1}  {:>6.1}x ({:>5.1}x)  {:>8.1}x ({:>5.1}x)  {:>11.2}x  {:>12.1}  {:>8.1}  {:.2}, {:.2}",
                mine.len(),
                mean(&|m| m.cold_ttft_ms),
                mean(&|m| m.warm_ttft_ms),
                mean(&|m| m.disk_ttft_ms),
                mean(&|m| m.cold_ttft_ms / m.warm_ttft_ms),
                min(&|m| m.cold_ttft_ms / m.warm_ttft_ms),
                mean(&|m| m.cold_ttft_ms / m.disk_ttft_ms),
                min(&|m| m.cold_ttft_ms / m.disk_ttft_ms),
                mean(&|m| m.disk_ttft_ms / m.warm_ttft_ms),
                mean(&|m| m.disk_load_ms),
                mean(&|m| m.store_ms),
                min(&|m| m.warm_agreement),
                min(&|m| m.disk_agreement),
            );
        }
    }
    Ok(())
}
