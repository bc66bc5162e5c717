//! Hardware detection (placeholder until the detection module lands).

/// Physical cores (falls back to logical CPUs, then 1). Never fails.
pub fn physical_cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
