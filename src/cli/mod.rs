//! Command-line interface: the clap definition of every subcommand, one file per subcommand.

mod embed;
mod generate;
mod hardware;
mod synth_model;

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
    /// Show the detected CPU, SIMD level, memory, GPUs and execution tier.
    Hardware(hardware::HardwareArgs),
    /// Write a GGUF model with random weights in a real model's shape (for speed measurements).
    SynthModel(synth_model::SynthModelArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => generate::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Hardware(args) => hardware::run(&args),
        Command::SynthModel(args) => synth_model::run(&args),
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

    #[test]
    fn parses_synth_model() {
        let cli = Cli::try_parse_from(["forge-cache", "synth-model", "--shape", "tinyllama-1.1b", "--quant", "q4_0", "-o", "m.gguf"]).expect("parses");
        let Command::SynthModel(a) = cli.command else { panic!("not synth-model") };
        assert_eq!((a.shape.as_str(), a.quant.as_str(), a.seed), ("tinyllama-1.1b", "q4_0", 0));
        assert_eq!(a.output, std::path::PathBuf::from("m.gguf"));
        assert!(Cli::try_parse_from(["forge-cache", "synth-model", "--shape", "x"]).is_err());
    }
}
