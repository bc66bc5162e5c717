//! Command-line interface: the clap definition of every subcommand, one file per subcommand,
//! plus the few helpers they share (the async runtime, text tables).

mod ab;
mod bench;
mod bench_blend;
mod bench_kv;
mod bench_kv_replicas;
mod bench_serve;
mod embed;
mod generate;
mod hardware;
mod health;
mod serve;
mod sql;
mod stats;
mod synth_model;

use clap::{Args, Parser, Subcommand, ValueEnum};
use forge_cache::engine::placement::{BackendChoice, PlacementOptions};
use forge_cache::vocab::CacheMode;

/// Where `serve` listens and the clients connect by default.
pub const DEFAULT_ADDR: &str = "127.0.0.1:50051";
pub const DEFAULT_URL: &str = "http://127.0.0.1:50051";
/// The database `serve`, `stats` and `sql` use by default.
pub const DEFAULT_DB: &str = "forge.db";

/// `--cache-mode`: the ground floor's [`CacheMode`] by its store name (`auto`, `bypass`, ...,
/// listed in `--help` and in the error for another value). A parser here rather than clap's
/// `ValueEnum` on the type keeps the vocabulary free of the command-line crate.
pub fn cache_mode_parser() -> impl clap::builder::TypedValueParser<Value = CacheMode> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(CacheMode::ALL.map(CacheMode::as_str))
        .try_map(|s| CacheMode::parse(&s).ok_or_else(|| format!("unknown cache mode {s:?}")))
}

/// forge-cache: an LLM inference service that reuses what it has already computed.
#[derive(Debug, Parser)]
#[command(name = "forge-cache", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (gRPC + OpenAI-compatible HTTP): the model, the caches, the knowledge store.
    Serve(serve::ServeArgs),
    /// Answer one prompt: offline with the model here, or through a running service (--server).
    Generate(generate::GenerateArgs),
    /// Hit rates per tier and tenant, tokens and time saved, latency percentiles (reads the database file).
    Stats(stats::StatsArgs),
    /// Run one read-only SQL query on the database file (writes are refused).
    Sql(sql::SqlArgs),
    /// Check (or wait for) a running service's grpc.health.v1 status.
    Health(health::HealthArgs),
    /// Sentence embeddings (all-MiniLM-L6-v2).
    Embed(embed::EmbedArgs),
    /// Measure prefill and decode speed (pp128, pp512, tg128, tg128@d1024), llama-bench style.
    Bench(bench::BenchArgs),
    /// Time to first token with KV-block reuse: cold, warm (memory), after a restart (disk), on SQuAD documents;
    /// with --postgres, a second replica's, KV blocks per replica vs shared.
    BenchKv(bench_kv::BenchKvArgs),
    /// Cache mode BLEND on SQuAD: answer agreement and F1 vs a full prefill, TTFT, per recompute ratio.
    BenchBlend(bench_blend::BenchBlendArgs),
    /// Time to first token of short requests while long prompts are being prefilled (0, 1, 4 at once).
    BenchTtft(bench_serve::BenchTtftArgs),
    /// Launch to the EXACT answer of a restarted `serve` on an existing store.
    BenchRestart(bench_serve::BenchRestartArgs),
    /// Show the detected CPU, SIMD level, memory, GPUs and execution tier.
    Hardware(hardware::HardwareArgs),
    /// Write a GGUF model with random weights in a real model's shape (for speed measurements).
    SynthModel(synth_model::SynthModelArgs),
    /// A/B test a workload against a running service: cache off (BYPASS) vs a cache mode.
    Ab(ab::AbArgs),
}

/// Runs the parsed command.
/// When the command started (the first thing `run` does).
static LAUNCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Time since the command started.
pub(crate) fn since_launch() -> std::time::Duration {
    LAUNCH.get_or_init(std::time::Instant::now).elapsed()
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    LAUNCH.get_or_init(std::time::Instant::now);
    match cli.command {
        Command::Serve(args) => serve::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Stats(args) => stats::run(&args),
        Command::Sql(args) => sql::run(&args),
        Command::Health(args) => health::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::BenchKv(args) => match &args.postgres {
            Some(url) => bench_kv_replicas::run_cli(&args, url),
            None => bench_kv::run(&args),
        },
        Command::BenchBlend(args) => bench_blend::run(&args),
        Command::BenchTtft(args) => bench_serve::run_ttft(&args),
        Command::BenchRestart(args) => bench_serve::run_restart(&args),
        Command::Hardware(args) => hardware::run(&args),
        Command::SynthModel(args) => synth_model::run(&args),
        Command::Ab(args) => ab::run(&args),
    }
}

/// `--backend`, `--tensor-split`, `--igpu-allow-software` (generate, serve, bench).
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Where the layers run: cpu; wgpu (every layer on the GPU adapter: an integrated GPU first,
    /// then a discrete one); hip (every layer on the HIP device: an AMD GPU, or an NVIDIA GPU
    /// through the CUDA driver); split (some layers on each tier, see --tensor-split). Embedding
    /// and sampling stay on the CPU.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Layers per tier in layer order for --backend split, e.g. cpu:10,igpu:8,dgpu:12 (igpu: the
    /// wgpu adapter, dgpu: the HIP device; default: chosen from each tier's memory and a short
    /// calibration run).
    #[arg(long)]
    pub tensor_split: Option<String>,
    /// Accept a software GPU adapter (lavapipe / llvmpipe) for the wgpu tier (tests use it).
    #[arg(long)]
    pub igpu_allow_software: bool,
}

/// How the sentence embedder holds its matrices (`--embed-weights` / `embed --weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmbedWeights {
    /// As all-MiniLM-L6-v2's safetensors stores them (F32).
    F32,
    /// Rounded to F16 at load: half the bytes per embedding (1 - cos vs F32 ~ 4e-7).
    F16,
}

impl From<EmbedWeights> for forge_cache::embed::MatrixFormat {
    fn from(w: EmbedWeights) -> Self {
        match w {
            EmbedWeights::F32 => forge_cache::embed::MatrixFormat::AsStored,
            EmbedWeights::F16 => forge_cache::embed::MatrixFormat::F16,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Cpu,
    Wgpu,
    Hip,
    Split,
}

impl BackendArgs {
    pub fn options(&self) -> anyhow::Result<PlacementOptions> {
        let backend = match self.backend {
            BackendArg::Cpu => BackendChoice::Cpu,
            BackendArg::Wgpu => BackendChoice::Wgpu,
            BackendArg::Hip => BackendChoice::Hip,
            BackendArg::Split => BackendChoice::Split,
        };
        let split = self.tensor_split.as_deref().map(str::parse).transpose()?;
        Ok(PlacementOptions { backend, split, allow_software: self.igpu_allow_software })
    }
}

/// The async runtime of the service and the clients: two workers are plenty (the model runs
/// on its own thread and thread pool; SQLite on the bounded blocking pool).
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).max_blocking_threads(8).enable_all().build()?)
}

/// Left-aligned columns separated by two spaces; cells longer than `max_cell` characters are
/// cut with `…`, line breaks shown as `⏎`.
pub(crate) fn table(headers: &[String], rows: &[Vec<String>], max_cell: usize) -> String {
    let cell = |s: &str| -> String {
        let s = s.replace('\n', "⏎");
        if s.chars().count() > max_cell {
            s.chars().take(max_cell.saturating_sub(1)).chain(['…']).collect()
        } else {
            s
        }
    };
    let rows: Vec<Vec<String>> = std::iter::once(headers.to_vec()).chain(rows.iter().cloned()).map(|r| r.iter().map(|c| cell(c)).collect()).collect();
    let widths: Vec<usize> =
        (0..headers.len()).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_hardware() {
        let cli = Cli::try_parse_from(["forge-cache", "hardware", "--json"]).expect("parses");
        assert!(matches!(cli.command, Command::Hardware(hardware::HardwareArgs { json: true, .. })));
        let cli = Cli::try_parse_from(["forge-cache", "hardware"]).expect("parses");
        assert!(matches!(cli.command, Command::Hardware(hardware::HardwareArgs { json: false, .. })));
        assert!(Cli::try_parse_from(["forge-cache", "hardware", "--bogus"]).is_err());
    }

    #[test]
    fn serve_defaults() {
        let cli = Cli::try_parse_from(["forge-cache", "serve"]).expect("parses");
        let Command::Serve(a) = cli.command else { panic!("not serve") };
        assert_eq!((a.db.to_str(), a.addr.as_str(), a.model, a.no_cache), (Some(DEFAULT_DB), DEFAULT_ADDR, None, false));
    }

    #[test]
    fn tables_align_and_cut() {
        let t = table(&["a".into(), "bb".into()], &[vec!["xxx".into(), "line\nbreak and more".into()]], 8);
        assert_eq!(t, "a    bb\nxxx  line⏎br…\n");
    }

    #[test]
    fn parses_backend_flags() {
        let cli = Cli::try_parse_from(["forge-cache", "bench", "--backend", "split", "--tensor-split", "cpu:10,igpu:20"]).expect("parses");
        let Command::Bench(a) = cli.command else { panic!("not bench") };
        let o = a.backend.options().expect("options");
        assert_eq!(o.backend, BackendChoice::Split);
        assert_eq!(o.split.expect("split").parts.len(), 2);
        let cli = Cli::try_parse_from(["forge-cache", "generate", "--prompt", "x", "--backend", "split", "--tensor-split", "cpu:1,igpu:2,dgpu:2"]).expect("parses");
        let Command::Generate(a) = cli.command else { panic!("not generate") };
        assert_eq!(a.backend.options().expect("three tiers").split.expect("split").parts.len(), 3);
        let cli = Cli::try_parse_from(["forge-cache", "bench", "--backend", "hip"]).expect("parses");
        let Command::Bench(a) = cli.command else { panic!("not bench") };
        assert_eq!(a.backend.options().expect("options").backend, BackendChoice::Hip);
        let cli = Cli::try_parse_from(["forge-cache", "serve", "--backend", "wgpu"]).expect("parses");
        let Command::Serve(a) = cli.command else { panic!("not serve") };
        assert_eq!(a.backend.options().expect("options").backend, BackendChoice::Wgpu);
        assert!(Cli::try_parse_from(["forge-cache", "bench", "--backend", "tpu"]).is_err());
    }

    #[test]
    fn parses_synth_model() {
        let cli = Cli::try_parse_from(["forge-cache", "synth-model", "--shape", "tinyllama-1.1b", "--quant", "q4_0", "-o", "m.gguf"]).expect("parses");
        let Command::SynthModel(a) = cli.command else { panic!("not synth-model") };
        assert_eq!((a.shape.as_deref(), a.quant.as_str(), a.seed), (Some("tinyllama-1.1b"), "q4_0", 0));
        assert_eq!(a.output, std::path::PathBuf::from("m.gguf"));
        assert!(Cli::try_parse_from(["forge-cache", "synth-model", "--shape", "x"]).is_err());
        let cli = Cli::try_parse_from(["forge-cache", "synth-model", "--arch", "gemma3", "--quant", "q4_k_m", "-o", "g.gguf"]).expect("parses");
        let Command::SynthModel(a) = cli.command else { panic!("not synth-model") };
        assert_eq!((a.arch.as_deref(), a.shape), (Some("gemma3"), None));
        assert!(Cli::try_parse_from(["forge-cache", "synth-model", "--arch", "gemma3", "--shape", "smollm2-135m", "-o", "x"]).is_err());
        assert!(Cli::try_parse_from(["forge-cache", "synth-model", "-o", "x"]).is_err());
    }
}
