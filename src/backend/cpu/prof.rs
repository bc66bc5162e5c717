//! Wall time of the CPU backend's steps, for finding what a prefill spends its time on where
//! there is no `perf` (the Intel machine): on only with `FORGE_CPU_PROFILE=1` (read once; off,
//! each step costs one load of a cached flag), summed over the process's calls and read (and
//! reset) with [`take_report`], which `forge-cache bench` prints after each test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Instant;

/// A timed step.
#[derive(Clone, Copy)]
pub enum Phase {
    /// activation quantization before a matmul region (caller's wall time)
    Quantize,
    /// q|k|v and other plain matmul regions
    Matmul,
    /// gate|up with the activation
    Gated,
    /// a projection with its residual add
    Residual,
    /// attention (all its regions)
    Attention,
    /// RMSNorm
    Norm,
    /// RoPE
    Rope,
    /// the activation alone, summed over threads (inside `Gated`)
    ActThreads,
    /// the caller waiting for workers at the end of a region (inside the regions above)
    TeamWait,
}

const NAMES: [&str; 9] = ["quantize", "matmul", "gate|up+act", "proj+residual", "attention", "rmsnorm", "rope", "act (thread-sum)", "team end wait"];

static ON: LazyLock<bool> = LazyLock::new(|| std::env::var("FORGE_CPU_PROFILE").is_ok_and(|v| v == "1"));
static NS: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];

/// A start time when profiling is on.
#[inline]
pub fn start() -> Option<Instant> {
    if *ON {
        Some(Instant::now())
    } else {
        None
    }
}

/// Adds the time since `t` (from [`start`]) to `p`.
#[inline]
pub fn stop(p: Phase, t: Option<Instant>) {
    if let Some(t) = t {
        NS[p as usize].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// The summed milliseconds per step since the last report (reset), when profiling is on.
pub fn take_report() -> Option<String> {
    if !*ON {
        return None;
    }
    let parts: Vec<String> = NAMES.iter().zip(&NS).map(|(n, v)| format!("{n} {:.1} ms", v.swap(0, Ordering::Relaxed) as f64 / 1e6)).collect();
    Some(parts.join(", "))
}
