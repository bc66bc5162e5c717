//! `forge-cache ab`: the same workload twice against a running service — once with every
//! request BYPASS (cache off), once with the chosen cache mode — each arm in its own fresh
//! tenant namespace (tenants share nothing, so each arm starts from an empty cache), then a
//! per-request comparison: identical texts, latency percentiles, requests/s, tokens computed,
//! hit rate per tier; a JSON report, a Markdown report and two SVG plots. `--interleave`
//! alternates the arms request by request instead of running one after the other.

mod report;
mod svg;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde::Serialize;

use forge_cache::server::client::Client;
use indicatif::{ProgressBar, ProgressStyle};
use forge_cache::server::proto::{self, CacheMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Verified,
    Trust,
    Exact,
    Equivalent,
}

impl Mode {
    fn proto(self) -> CacheMode {
        match self {
            Mode::Verified => CacheMode::Verified,
            Mode::Trust => CacheMode::Trust,
            Mode::Exact => CacheMode::Exact,
            Mode::Equivalent => CacheMode::Equivalent,
        }
    }
}

#[derive(Debug, Args)]
pub struct AbArgs {
    /// The service to test (start it with `forge-cache serve`). Several, comma-separated
    /// (replicas): request i goes to server i mod n (round-robin).
    #[arg(long, default_value = super::DEFAULT_URL)]
    pub server: String,
    /// Workload file: one JSON object per line, {"prompt", "tenant"?, "max_tokens"?, "system"?}.
    #[arg(long, required_unless_present = "make_workload")]
    pub workload: Option<PathBuf>,
    /// Cache mode of the cache-on arm.
    #[arg(long, value_enum, default_value_t = Mode::Verified)]
    pub mode: Mode,
    /// Write the JSON report here (per request and totals).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Folder for report.md, latency_cdf.svg and hit_rate.svg.
    #[arg(long, default_value = "ab-report")]
    pub out: PathBuf,
    /// Run only the cache-on arm (no comparison): e.g. to calibrate TRUST with --on-tenant.
    #[arg(long)]
    pub skip_off: bool,
    /// Run the arms interleaved (one cache-off request, one cache-on request, alternating
    /// which goes first), so both see the same load on a shared machine; each arm's
    /// requests/s is then its request count over the sum of its own requests' times. Without
    /// it the whole cache-off arm runs first, then the cache-on arm.
    #[arg(long, conflicts_with = "skip_off")]
    pub interleave: bool,
    /// Tenant of the cache-on arm (default: a fresh one per run). Reusing one across runs keeps
    /// what it learned, e.g. TRUST outcomes from an earlier verified run.
    #[arg(long)]
    pub on_tenant: Option<String>,
    /// Build a workload from ../shared/data instead of running one.
    #[arg(long, value_enum)]
    pub make_workload: Option<workload::Kind>,
    /// The shared data folder (--make-workload; default: shared/data beside the project root,
    /// found from the current folder or from this binary's place in the project's target/).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Lines to write (--make-workload).
    #[arg(long, default_value_t = 500)]
    pub requests: usize,
    /// Skip this many pairs (qqp) or questions (zipf) of the shuffled data: disjoint workloads.
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    /// max_tokens of every generated line (--make-workload).
    #[arg(long, default_value_t = 48)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// zipf: size of the question pool (popularity of rank r ∝ 1/r^1.1).
    #[arg(long, default_value_t = 25)]
    pub distinct: usize,
    /// Output of --make-workload.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
}

/// One request of one arm.
#[derive(Debug, Clone, Serialize)]
pub struct Shot {
    /// The answer text (empty on error).
    pub text: String,
    /// The tier that served it (e.g. `EXACT`, `TRUST`), or `ERROR`.
    pub served_from: String,
    /// Client round-trip latency, ms.
    pub latency_ms: f64,
    /// Positions the model computed; 0 when served from a cache.
    pub tokens_computed: u32,
    /// Draft tokens offered to the model.
    pub draft_tokens: u32,
    /// Draft tokens the model agreed with.
    pub draft_accepted: u32,
    /// The neighbour's similarity when one was used, else 1 for cache hits, 0 when computed.
    pub similarity: f32,
    /// Server-side prefill time (for EQUIVALENT hits: the check's scoring pass), prompt and
    /// answer tokens.
    pub prefill_ms: f64,
    /// Prompt tokens as the model sees them.
    pub prompt_tokens: u32,
    /// Answer tokens.
    pub completion_tokens: u32,
    /// The request's error, if it failed.
    pub error: Option<String>,
}

/// An arm's run.
pub struct Arm {
    /// One per workload line, in workload order.
    pub shots: Vec<Shot>,
    /// Wall time of the arm (interleaved: the sum of its own requests' times).
    pub wall: Duration,
}

pub fn run(a: &AbArgs) -> anyhow::Result<()> {
    if let Some(kind) = a.make_workload {
        let out = a.output.as_deref().context("--make-workload needs -o FILE")?;
        let data = data_dir(a.data.as_deref())?;
        let (n, distinct) = workload::make(&workload::MakeArgs {
            kind,
            data: &data,
            requests: a.requests,
            offset: a.offset,
            max_tokens: a.max_tokens,
            seed: a.seed,
            distinct: a.distinct,
            out,
        })?;
        eprintln!("wrote {} ({n} requests, {distinct} distinct prompts)", out.display());
        return Ok(());
    }
    let path = a.workload.as_deref().context("--workload is required")?;
    let lines = workload::read(path)?;
    let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default();
    let rt = super::runtime()?;
    let (off, on) = rt.block_on(async {
        let mut clients = Vec::new();
        for server in a.server.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            clients.push(Client::connect(server).await.with_context(|| format!("connecting to {server}"))?);
        }
        anyhow::ensure!(!clients.is_empty(), "--server names no server");
        let client = &clients[..];
        let on_tenant = a.on_tenant.clone();
        let on_tenant = |t: &str| on_tenant.clone().unwrap_or_else(|| format!("ab{run_id}-on-{t}"));
        let off_tenant = |t: &str| format!("ab{run_id}-off-{t}");
        if a.interleave {
            let (off, on) = interleaved(client, &lines, a.mode.proto(), off_tenant, on_tenant).await?;
            return anyhow::Ok((Some(off), on));
        }
        let off = if a.skip_off { None } else { Some(arm(client, &lines, CacheMode::Bypass, off_tenant, "cache off").await?) };
        let on = arm(client, &lines, a.mode.proto(), on_tenant, "cache on ").await?;
        anyhow::Ok((off, on))
    })?;
    let r = report::Report::build(&lines, off.as_ref(), &on, a.mode, a.interleave);
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    r.write_files(&a.out, path)?;
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&r)?).with_context(|| format!("writing {}", j.display()))?;
    }
    print!("{}", r.summary());
    eprintln!("report: {}/report.md{}", a.out.display(), a.json.as_ref().map(|j| format!(", {}", j.display())).unwrap_or_default());
    if r.failed > 0 {
        bail!("{} requests failed (see the report)", r.failed);
    }
    Ok(())
}

/// The shared data folder: `--data` when given, else the first `shared/data` beside a
/// forge-cache project root (the current folder or one above it, then the folders above this
/// binary, e.g. `target/release/`), else `../shared/data`; an error names every place looked at.
fn data_dir(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(d) = given {
        if d.is_dir() {
            return Ok(d.to_path_buf());
        }
        bail!("--data {}: no such folder", d.display());
    }
    let is_root = |d: &Path| std::fs::read_to_string(d.join("Cargo.toml")).is_ok_and(|t| t.contains("name = \"forge-cache\""));
    let mut starts: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    starts.extend(std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)));
    let mut looked = Vec::new();
    for start in &starts {
        for dir in start.ancestors().filter(|d| is_root(d)) {
            let candidate = dir.join("../shared/data");
            if candidate.is_dir() {
                return Ok(candidate);
            }
            looked.push(candidate);
        }
    }
    let fallback = PathBuf::from("../shared/data");
    if fallback.is_dir() {
        return Ok(fallback);
    }
    looked.push(fallback);
    bail!(
        "the shared data folder was not found; looked at {} (pass --data DIR)",
        looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// Runs every line in order, one at a time (line i on server i mod n), drawing a progress bar
/// on stderr.
async fn arm(clients: &[Client], lines: &[workload::Line], mode: CacheMode, tenant: impl Fn(&str) -> String, label: &str) -> anyhow::Result<Arm> {
    let start = Instant::now();
    let mut shots = Vec::with_capacity(lines.len());
    let mut hits = 0;
    let pb = bar(label, lines.len());
    for (i, l) in lines.iter().enumerate() {
        let (shot, _) = shoot(&clients[i % clients.len()], l, mode, &tenant).await;
        hits += usize::from(shot.served_from != "MODEL");
        shots.push(shot);
        tick(&pb, hits);
    }
    pb.finish();
    Ok(Arm { shots, wall: start.elapsed() })
}

/// Both arms at once, one request at a time, alternating: line i's cache-off request then its
/// cache-on request for even i, the other way round for odd i. Both arms thus see the same
/// machine load over the run; each arm's wall time is the sum of its own requests' times.
async fn interleaved(
    clients: &[Client],
    lines: &[workload::Line],
    mode: CacheMode,
    off_tenant: impl Fn(&str) -> String,
    on_tenant: impl Fn(&str) -> String,
) -> anyhow::Result<(Arm, Arm)> {
    let (mut off, mut on) = (Arm { shots: Vec::new(), wall: Duration::ZERO }, Arm { shots: Vec::new(), wall: Duration::ZERO });
    let mut hits = 0;
    let pb = bar("off+on   ", lines.len());
    for (i, l) in lines.iter().enumerate() {
        let order = if i % 2 == 0 { [false, true] } else { [true, false] };
        for is_on in order {
            let (arm, m, t): (&mut Arm, CacheMode, &dyn Fn(&str) -> String) =
                if is_on { (&mut on, mode, &on_tenant) } else { (&mut off, CacheMode::Bypass, &off_tenant) };
            let (shot, took) = shoot(&clients[i % clients.len()], l, m, t).await;
            if is_on {
                hits += usize::from(shot.served_from != "MODEL");
            }
            arm.shots.push(shot);
            arm.wall += took;
        }
        tick(&pb, hits);
    }
    pb.finish();
    Ok((off, on))
}

/// One request; its outcome and how long the call took here.
async fn shoot(client: &Client, l: &workload::Line, mode: CacheMode, tenant: &dyn Fn(&str) -> String) -> (Shot, Duration) {
    let t0 = Instant::now();
    let mut c = client.clone().with_tenant(tenant(l.tenant.as_deref().unwrap_or("default")));
    let req = proto::GenerateRequest {
        prompt: l.prompt.clone(),
        system: l.system.clone().unwrap_or_default(),
        max_tokens: l.max_tokens,
        cache_mode: mode as i32,
        ..Default::default()
    };
    let shot = match c.generate(req).await {
        Ok(g) => Shot {
            text: g.text.clone(),
            served_from: g.served_from_name().to_string(),
            latency_ms: g.client_latency.as_secs_f64() * 1e3,
            tokens_computed: g.outcome.tokens_computed,
            draft_tokens: g.outcome.draft_tokens,
            draft_accepted: g.outcome.draft_tokens_accepted,
            similarity: g.outcome.similarity,
            prefill_ms: g.outcome.prefill_ms,
            prompt_tokens: g.outcome.prompt_token_ids.len() as u32,
            completion_tokens: g.outcome.completion_tokens,
            error: None,
        },
        Err(e) => Shot {
            text: String::new(),
            served_from: "ERROR".into(),
            latency_ms: t0.elapsed().as_secs_f64() * 1e3,
            tokens_computed: 0,
            draft_tokens: 0,
            draft_accepted: 0,
            similarity: 0.0,
            prefill_ms: 0.0,
            prompt_tokens: 0,
            completion_tokens: 0,
            error: Some(e.to_string()),
        },
    };
    (shot, t0.elapsed())
}

/// The progress bar of a run (indicatif): requests done, rate, hit rate, ETA. Drawn on stderr,
/// hidden when stderr is not a terminal.
fn bar(label: &str, total: usize) -> ProgressBar {
    let pb = ProgressBar::new(total as u64);
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len}  {per_sec}  {msg}  eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#>.");
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

/// One request done: advance the bar, show the hit rate so far.
fn tick(pb: &ProgressBar, hits: usize) {
    pb.inc(1);
    pb.set_message(format!("hits {:.0}%", 100.0 * hits as f64 / pb.position().max(1) as f64));
}
