//! Command-line interface: the clap definition of every subcommand, one file per subcommand.

mod bench;
mod embed;
mod generate;
mod hardware;

use clap::{Parser, Subcommand};

/// forge-cache: an LLM inference service that reuses what it has already computed.
#[derive(Debug, Parser)]
#[command(name = "forge-cache", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the model on one prompt, offline, and print the text and its speed.
    Generate(generate::GenerateArgs),
    /// Sentence embeddings (all-MiniLM-L6-v2).
    Embed(embed::EmbedArgs),
    /// Measure prefill and decode speed (pp128, pp512, tg128, tg128@d1024), llama-bench style.
    Bench(bench::BenchArgs),
    /// Show the detected CPU, SIMD level, memory, GPUs and execution tier.
    Hardware(hardware::HardwareArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Hardware(args) => hardware::run(&args),
    }
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
        assert!(matches!(cli.command, Command::Hardware(hardware::HardwareArgs { json: true })));
        let cli = Cli::try_parse_from(["forge-cache", "hardware"]).expect("parses");
        assert!(matches!(cli.command, Command::Hardware(hardware::HardwareArgs { json: false })));
        assert!(Cli::try_parse_from(["forge-cache", "hardware", "--bogus"]).is_err());
    }
}
