//! The `forge-cache` command line: parses arguments (clap, `src/cli/`) and runs one subcommand.
//! Errors are reported with anyhow here only; the library uses typed errors.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    quiet_vulkan_wsi();
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

/// Mesa's Vulkan window-system layers (loaded whenever wgpu enumerates adapters, e.g. `hardware`)
/// print `error: XDG_RUNTIME_DIR is invalid or not set` for every adapter when that variable is
/// unset, as it is under cron, ssh without a session, or containers. forge-cache never opens a
/// window, so give those layers a private, empty runtime folder instead (0700, this user's).
/// Runs first in `main`, before any thread exists.
fn quiet_vulkan_wsi() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|v| !v.is_empty()) {
        return;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let dir = std::env::temp_dir().join(format!("forge-cache-runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        let ours = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0);
        if ours {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}
