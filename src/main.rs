//! The `forge-cache` command line: parses arguments (clap, `src/cli/`) and runs one subcommand.
//! Errors are reported with anyhow here only; the library uses typed errors.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    cli::run(cli::Cli::parse())
}
