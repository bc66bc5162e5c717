//! `forge-cache bench`: a llama-bench-like table (pp128, pp512, pp4096, tg128, tg128@d1024,
//! tg128@d4096) for the CPU backend, the wgpu tier, the HIP tier or a split of them (`--backend`,
//! `--tensor-split`). `--json` prints a list of rows `{test, threads, backend, tokens_per_s}`;
//! with `--bandwidth`, decode rows also carry the bytes one step reads (weights + KV at the
//! test's mean context), the floor those bytes and the measured bandwidth imply, and the fraction
//! of it reached.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::bench::{bench, decode_bytes, BenchTest};
use forge_cache::engine::placement::place;
use forge_cache::engine::Model;

use super::BackendArg;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// GGUF model file, or the short name of a fetched model (smollm2, gemma3); default: SmolLM2-135M-Instruct Q4_1.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Timed repetitions per test (after one warm-up run).
    #[arg(long, short = 'r', default_value_t = 3)]
    pub reps: usize,
    /// Run only these tests (comma-separated, e.g. `tg128,pp512`; names as printed, or any
    /// `ppN`, `tgN`, `tgN@dD`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Also measure memory read bandwidth (1 GiB and a model-sized buffer) and report, per decode
    /// test, the bytes a step reads, the floor they imply and the fraction of it reached.
    #[arg(long)]
    pub bandwidth: bool,
    /// Print a JSON list of rows instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub backend: super::BackendArgs,
}

#[derive(serde::Serialize)]
struct Row<'a> {
    test: &'a str,
    threads: usize,
    backend: &'a str,
    tokens_per_s: f64,
    /// Decode rows with `--bandwidth`: bytes one step reads (weights + KV at the mean context).
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_per_token: Option<u64>,
    /// Decode rows with `--bandwidth`: measured bandwidth / bytes_per_token.
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_tokens_per_s: Option<f64>,
    /// Decode rows with `--bandwidth`: tokens_per_s / floor_tokens_per_s.
    #[serde(skip_serializing_if = "Option::is_none")]
    floor_fraction: Option<f64>,
}

pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    let path = forge_cache::models::resolve_llm(a.model.as_deref()).map_err(anyhow::Error::msg)?;
    if !path.exists() {
        bail!(forge_cache::models::missing_hint(&path));
    }
    let cpu = Arc::new(CpuBackend::new(a.threads)?);
    let (threads, backend_name) = (cpu.threads(), format!("cpu-{}{}", cpu.simd().name(), if cpu.amx() { "+amx" } else { "" }));
    let cpu_ref = cpu.clone();
    let mut model = Model::load_unprepared(&path, cpu).with_context(|| format!("loading {}", path.display()))?;
    let placement = place(&mut model, &a.backend.options()?)?;
    // The CPU's copies only of the layers it runs.
    model.prepare_weights();
    eprintln!("forge-cache: layers {placement}: {}", model.placement());
    let backend_name = match (a.backend.backend, model.gpu_layers()) {
        (_, None) => backend_name,
        (BackendArg::Wgpu, Some(_)) => "wgpu".to_string(),
        (BackendArg::Hip, Some(_)) => "hip".to_string(),
        (_, Some(_)) => format!("split {}", placement.to_string().split(' ').next().unwrap_or_default()),
    };
    let model_name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let tests: Vec<BenchTest> = if a.only.is_empty() {
        BenchTest::defaults()
    } else {
        a.only
            .iter()
            .map(|n| BenchTest::parse(n).with_context(|| format!("--only {n:?}: not a test name (ppN, tgN or tgN@dD, e.g. pp4096, tg128@d1024)")))
            .collect::<anyhow::Result<_>>()?
    };
    let mut bandwidth = None;
    if a.bandwidth {
        let model_bytes = std::fs::metadata(&path)?.len();
        let big: Vec<u64> = (0..(1u64 << 27)).collect();
        let bw_big = cpu_ref.read_bandwidth(&big, 5);
        drop(big);
        let small: Vec<u64> = (0..model_bytes / 8).collect();
        let bw_small = cpu_ref.read_bandwidth(&small, 5);
        drop(small);
        let weights = decode_bytes(&model, 0).weights;
        eprintln!(
            "read bandwidth, {threads} threads: {:.1} GB/s over 1 GiB, {:.1} GB/s over {:.0} MiB (model size)",
            bw_big / 1e9,
            bw_small / 1e9,
            model_bytes as f64 / (1 << 20) as f64
        );
        eprintln!(
            "decode floor at depth 0: {weights} weight bytes / {:.1} GB/s = {:.2} ms per token = {:.0} tokens/s (KV adds to it at depth)",
            bw_big / 1e9,
            weights as f64 / bw_big * 1e3,
            bw_big / weights as f64
        );
        bandwidth = Some(bw_big);
    }
    // Per test: bytes a decode step reads and the floor they imply (with --bandwidth).
    let floor = |t: &BenchTest| -> Option<(u64, f64)> {
        let bytes = decode_bytes(&model, t.mean_context()?).total();
        Some((bytes, bandwidth? / bytes as f64))
    };
    if !a.json {
        if bandwidth.is_some() {
            println!("| model | backend | threads | test | t/s | bytes/token | floor t/s | of floor |");
            println!("|---|---|---|---|---|---|---|---|");
        } else {
            println!("| model | backend | threads | test | t/s |");
            println!("|---|---|---|---|---|");
        }
    }
    let mut i = 0;
    if !a.json {
        eprintln!("(each test warms up until two consecutive untimed runs agree within 5%, at most 8 runs or 30 s)");
    }
    let results = bench(&model, &tests, a.reps, |r| {
        if !a.json {
            eprintln!("{}: {} warm-up runs", r.test, r.warmup);
            let extra = match (bandwidth, floor(&tests[i])) {
                (None, _) => String::new(),
                (Some(_), None) => " | | |".to_string(),
                (Some(_), Some((bytes, f))) => format!(" {:.1} MB | {f:.0} | {:.0}% |", bytes as f64 / 1e6, 100.0 * r.tokens_per_s / f),
            };
            println!("| {model_name} | {backend_name} | {threads} | {} | {:.2} ± {:.2} |{extra}", r.test, r.tokens_per_s, r.stddev);
        }
        // FORGE_CPU_PROFILE=1: where the CPU backend's time went in this test (warm-up included)
        if let Some(p) = forge_cache::backend::cpu::prof::take_report() {
            println!("profile {}: {p}", r.test);
        }
        i += 1;
    })?;
    if a.json {
        let rows: Vec<Row> = results
            .iter()
            .zip(&tests)
            .map(|(r, t)| {
                let f = floor(t);
                Row {
                    test: &r.test,
                    threads,
                    backend: &backend_name,
                    tokens_per_s: r.tokens_per_s,
                    bytes_per_token: f.map(|f| f.0),
                    floor_tokens_per_s: f.map(|f| f.1),
                    floor_fraction: f.map(|f| r.tokens_per_s / f.1),
                }
            })
            .collect();
        println!("{}", serde_json::to_string(&rows)?);
    } else {
        eprintln!("{}", model.placement());
    }
    Ok(())
}
