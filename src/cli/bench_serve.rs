//! Service-level timings through the real service on loopback:
//!
//! * `forge-cache bench-ttft`: time to first token of short greedy requests while 0, 1 and 4
//!   long prompts (8,000 tokens by default) are being prefilled, each long one of its own tenant
//!   (issue 16: no request waits behind another's long prompt). The long requests' answers are
//!   checked against the same prompt run alone.
//! * `forge-cache bench-restart`: from launching `forge-cache serve` on an existing store to the
//!   EXACT answer of a question asked before the restart (the service's start-up path), p50 /
//!   p99 over several launches per model, with where serve's start-up time went (its log).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::engine::bench::ledger_text;
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::gguf::GgufFile;
use forge_cache::server::client::Client;
use forge_cache::server::proto::{CacheMode, GenerateRequest, ServedFrom};
use forge_cache::server::{self, ServerConfig};

#[derive(Debug, Args)]
pub struct BenchTtftArgs {
    /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads for the model (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Tokens of each long prompt.
    #[arg(long, default_value_t = 8000)]
    pub long_tokens: usize,
    /// Numbers of concurrent long prefills to measure under.
    #[arg(long, value_delimiter = ',', default_value = "0,1,4")]
    pub concurrent: Vec<usize>,
    /// Short requests without long prefills; beside them, short requests go on until the long
    /// requests end (so the late, slowest part of a long prefill is measured too).
    #[arg(long, default_value_t = 20)]
    pub shorts: usize,
    /// Pause between short requests, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub gap_ms: u64,
    /// Print one JSON object per case.
    #[arg(long)]
    pub json: bool,
}

fn request(prompt: String, raw: bool, max_tokens: u32) -> GenerateRequest {
    let system = if raw { String::new() } else { "You are a helpful assistant.".into() };
    GenerateRequest { prompt, raw, system, max_tokens: Some(max_tokens), cache_mode: CacheMode::Bypass as i32, ..Default::default() }
}

/// Time to the first streamed token, and all tokens.
async fn timed(c: &mut Client, req: GenerateRequest) -> anyhow::Result<(Duration, Vec<u32>)> {
    let t0 = Instant::now();
    let mut stream = c.generate_stream(req).await?;
    let (mut first, mut tokens) = (None, Vec::new());
    while let Some(m) = stream.message().await? {
        if !m.token_ids.is_empty() {
            first.get_or_insert_with(|| t0.elapsed());
        }
        tokens.extend_from_slice(&m.token_ids);
        if m.outcome.is_some() {
            return Ok((first.unwrap_or_else(|| t0.elapsed()), tokens));
        }
    }
    bail!("the stream ended without an outcome")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).unwrap_or_default()
}

pub fn run_ttft(a: &BenchTtftArgs) -> anyhow::Result<()> {
    let model = a.model.clone().unwrap_or_else(forge_cache::models::default_llm);
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model)?)?;
    let most = a.concurrent.iter().copied().max().unwrap_or(0);
    let longs: Vec<String> = (0..most).map(|i| ledger_text(&tok, a.long_tokens, 100 + i as u64)).collect::<Result<_, _>>()?;
    let shorts = ["What is 2 + 2?", "What is the capital of France?", "Name a primary color.", "Is ice cold?"];
    let dir = tempfile_dir()?;
    let mut config = ServerConfig::new(&model, dir.join("bench.db"));
    config.threads = a.threads;
    config.kv = None;
    config.embedder = None;
    config.scheduler.max_active = config.scheduler.max_active.max(most + 2);
    super::runtime()?.block_on(async {
        let server = server::start(config, "127.0.0.1:0").await.context("starting the service")?;
        let client = Client::connect(&server.url()).await?;
        let mut short_client = client.clone().with_tenant("short");
        let mut alone_short = Vec::new();
        for q in shorts {
            alone_short.push(timed(&mut short_client, request(q.into(), false, 8)).await?.1);
        }
        // The long answers alone, to compare with their answers beside the others.
        let mut alone_long = Vec::new();
        if most > 0 {
            let t = Instant::now();
            alone_long.push(timed(&mut client.clone().with_tenant("long-0"), request(longs[0].clone(), true, 4)).await?.1);
            eprintln!("long prompt alone ({} tokens): {:.1} s", a.long_tokens, t.elapsed().as_secs_f64());
        }
        for &k in &a.concurrent {
            let tasks: Vec<_> = (0..k)
                .map(|i| {
                    let (mut c, p) = (client.clone().with_tenant(format!("long-{i}")), longs[i].clone());
                    tokio::spawn(async move { timed(&mut c, request(p, true, 4)).await })
                })
                .collect();
            if k > 0 {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let mut ttft = Vec::new();
            let t0 = Instant::now();
            for i in 0.. {
                let done = if k > 0 { tasks.iter().all(|t| t.is_finished()) } else { i >= a.shorts };
                if done {
                    break;
                }
                let (first, tokens) = timed(&mut short_client, request(shorts[i % shorts.len()].into(), false, 8)).await?;
                if tokens != alone_short[i % shorts.len()] {
                    bail!("a short request's answer changed beside {k} long prefills");
                }
                ttft.push(first.as_secs_f64() * 1e3);
                tokio::time::sleep(Duration::from_millis(a.gap_ms)).await;
            }
            let mut same = true;
            for (i, t) in tasks.into_iter().enumerate() {
                let (_, tokens) = t.await??;
                if i == 0 {
                    same &= tokens == alone_long[0];
                }
            }
            ttft.sort_by(f64::total_cmp);
            let (p50, p99) = (percentile(&ttft, 0.5), percentile(&ttft, 0.99));
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"long_prefills": k, "long_tokens": a.long_tokens, "shorts": ttft.len(), "ttft_p50_ms": p50,
                        "ttft_p99_ms": p99, "ttft_max_ms": ttft.last(), "long_same_as_alone": (k > 0).then_some(same),
                        "seconds": t0.elapsed().as_secs_f64(), "load": load_average()})
                );
            } else {
                println!(
                    "{k} long prefills ({} tokens): {} short requests, time to first token p50 {p50:.0} ms, p99 {p99:.0} ms{} (load average {})",
                    a.long_tokens,
                    ttft.len(),
                    if k > 0 { if same { "; long answer = alone" } else { "; LONG ANSWER DIFFERS FROM ALONE" } } else { "" },
                    load_average()
                );
            }
            if !same {
                bail!("a long request's answer changed beside the short ones");
            }
        }
        server.stop().await?;
        Ok(())
    })
}

#[derive(Debug, Args)]
pub struct BenchRestartArgs {
    /// GGUF model file; repeat for several models (default: SmolLM2-135M-Instruct Q4_1). A
    /// model without a chat template is asked a raw prompt.
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// Restarts to time per model.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Extra arguments for `serve` (e.g. "--no-semantic").
    #[arg(long, allow_hyphen_values = true, num_args = 0..)]
    pub serve_args: Vec<String>,
}

/// A port free right now.
fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("forge-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// What serve's log says about one start: its start-up line, launch (its `main`) to listening,
/// when the tokenizer was built, and whether the answer needed the prompt's tokens.
#[derive(Default)]
struct ServeLog {
    startup: String,
    listening_ms: Option<f64>,
    tokenizer_ms: Option<f64>,
    tokenized: Option<bool>,
    /// The EXACT request inside serve: received to its outcome.
    request_ms: Option<f64>,
}

/// The value of `field=` in a log line (tracing's fmt layout; strings are quoted).
fn log_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {field}="))? + field.len() + 2;
    let rest = &line[at..];
    Some(match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest.split_whitespace().next()?,
    })
}

fn serve_log(stderr: &str) -> ServeLog {
    let mut log = ServeLog::default();
    for line in stderr.lines() {
        if let (true, Some((_, phases))) = (line.contains("start-up"), line.split_once(" phases=")) {
            // The last field: the phases, with spaces.
            log.startup = phases.to_string();
            log.listening_ms = log_field(line, "since_launch_ms").and_then(|v| v.parse().ok());
        } else if line.contains("tokenizer built") {
            log.tokenizer_ms = log_field(line, "since_load_ms").and_then(|v| v.parse().ok());
        } else if line.contains("served_from=EXACT") {
            log.tokenized = log_field(line, "tokenized").and_then(|v| v.parse().ok());
            log.request_ms = log_field(line, "latency_ms").and_then(|v| v.parse().ok());
        }
    }
    log
}

pub fn run_restart(a: &BenchRestartArgs) -> anyhow::Result<()> {
    let models = if a.model.is_empty() { vec![forge_cache::models::default_llm()] } else { a.model.clone() };
    let rt = super::runtime()?;
    for model in &models {
        restart_model(a, model, &rt)?;
    }
    Ok(())
}

/// p50 / p99 of one model's restarts.
fn restart_model(a: &BenchRestartArgs, model: &std::path::Path, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let name = model.file_name().map_or_else(|| model.display().to_string(), |n| n.to_string_lossy().into_owned());
    // A fresh store per model.
    let dir = tempfile_dir()?.join(&name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("restart.db");
    let gguf = GgufFile::open(model).with_context(|| format!("reading {}", model.display()))?;
    let raw = forge_cache::engine::chat::ChatTemplate::from_gguf(&gguf)?.is_none();
    drop(gguf);
    let ask = || GenerateRequest { cache_mode: CacheMode::Auto as i32, ..request("What is the capital of France?".into(), raw, 16) };
    let load_before = load_average();
    let (mut times, mut listening, mut tokenizer, mut waited) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for run in 0..=a.runs {
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let t0 = Instant::now();
        let child = Command::new(&exe)
            // The HTTP API on any free port: it is part of a default start, and 8080 may be taken.
            .args(["serve", "--addr", &format!("127.0.0.1:{port}"), "--http-addr", "127.0.0.1:0", "--db"])
            .arg(&db)
            .arg("--model")
            .arg(model)
            .args(&a.serve_args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("launching serve")?;
        let mut connected = Duration::ZERO;
        let answer = rt.block_on(async {
            loop {
                if let Ok(mut c) = Client::connect(&url).await {
                    connected = t0.elapsed();
                    break c.generate(ask()).await;
                }
                if t0.elapsed() > Duration::from_secs(60) {
                    bail!("serve did not answer within 60 s");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            .map_err(anyhow::Error::from)
        });
        let took = t0.elapsed().as_secs_f64() * 1e3;
        // SAFETY: sending SIGTERM to our own child process (graceful stop) has no memory effects.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let out = child.wait_with_output()?;
        let answer = answer?;
        let log = serve_log(&String::from_utf8_lossy(&out.stderr));
        let ms = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1}"));
        if run == 0 {
            println!("{name}: first start (fresh store, answer from the model): {took:.1} ms; start-up: {}", log.startup);
            continue;
        }
        if answer.served_from() != ServedFrom::Exact {
            bail!("{name} run {run}: the answer after a restart came from {:?}, not EXACT", answer.served_from());
        }
        times.push(took);
        listening.extend(log.listening_ms);
        tokenizer.extend(log.tokenizer_ms);
        waited += usize::from(log.tokenized == Some(true));
        println!(
            "{name} restart {run}: launch to EXACT answer {took:.1} ms (connected at {:.1} ms; serve listening {} ms after its main; the request {} ms inside serve; \
             tokenizer built {} ms after loading began; the hit tokenized: {}); start-up: {}",
            connected.as_secs_f64() * 1e3,
            ms(log.listening_ms),
            ms(log.request_ms),
            ms(log.tokenizer_ms),
            log.tokenized.map_or("?".into(), |t| t.to_string()),
            log.startup
        );
    }
    for v in [&mut times, &mut listening, &mut tokenizer] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "{name}: launch to EXACT answer after a restart p50 {:.1} ms, p99 {:.1} ms (min {:.1}, max {:.1}) over {} launches; \
         serve listening p50 {:.1} ms after its main; tokenizer built p50 {:.1} ms after loading began; hits that tokenized: {waited}; \
         load average {load_before} before, {} after",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.first().copied().unwrap_or(f64::NAN),
        times.last().copied().unwrap_or(f64::NAN),
        times.len(),
        percentile(&listening, 0.5),
        percentile(&tokenizer, 0.5),
        load_average()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
