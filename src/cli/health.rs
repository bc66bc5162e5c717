//! `forge-cache health`: asks a running service's `grpc.health.v1.Health/Check`; with `--wait`,
//! keeps asking until it is SERVING (scripts use it to wait for `serve` to come up).

use std::time::Duration;

use clap::Args;

#[derive(Debug, Args)]
pub struct HealthArgs {
    #[arg(long, default_value = super::DEFAULT_URL)]
    pub server: String,
    /// Keep trying for up to this many seconds.
    #[arg(long, default_value_t = 0.0)]
    pub wait: f64,
}

pub fn run(a: &HealthArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_secs_f64(a.wait.max(0.0));
    super::runtime()?.block_on(forge_cache::server::client::wait_healthy(&a.server, timeout))?;
    println!("SERVING");
    Ok(())
}
