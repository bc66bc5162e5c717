//! The `forge-cache` command line: parses arguments (clap, `src/cli/`) and runs one subcommand.
//! Errors are reported with anyhow here only; the library uses typed errors.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    init_tracing();
    cli::run(cli::Cli::parse())
}

/// Logs and spans to stderr, filtered by `RUST_LOG` (default: `info` for forge-cache, `warn`
/// for everything else; e.g. `RUST_LOG=forge_cache=debug` adds the per-stage spans).
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,forge_cache=info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).with_target(false).init();
}
