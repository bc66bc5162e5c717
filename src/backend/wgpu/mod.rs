//! wgpu backend: WGSL compute kernels for integrated (and discrete) GPUs through Vulkan, Metal or
//! DX12, with the CPU as the fallback whenever no adapter exists.
//!
//! * `context` — adapter choice ([`WgpuContext::detect`]: integrated, then discrete; software only
//!   when asked), the compute pipelines (compiled once), buffer and read-back helpers;
//!   `pipeline` — compiling one kernel (bind group layout, shader module, pipeline);
//!   `attention_kv` — when the prefill attention runs per KV head and block of tokens;
//!   `coop` — the tensor-core matmul (cooperative matrices): which adapters take it, its
//!   pipelines and grid.
//! * `backend` — [`WgpuBackend`]: the [`Backend`](super::Backend) trait op by op (upload, one
//!   dispatch, read back). Slow by design; it is what the kernel tests compare with the CPU.
//! * `options` — [`WgpuOptions`]: every knob (adapter, kernel variants, submission, read-back),
//!   the measured defaults, `FORGE_WGPU_*` parsed in one function for the command line.
//! * `layers` — [`GpuLayers`]: a range of a model's layers resident on the GPU (weights uploaded
//!   once, `upload`; the dispatch lists of each layer, `plan`; a step recorded ahead,
//!   `layers/step`); `kv` — one sequence's KV on the GPU and its per-sequence dispatches.
//! * `segment` — `GpuLayers` as the engine's offloaded segment (`super::offload::LayerOffload`),
//!   and [`WgpuLayers`]: a stack with one sequence's cache, for tests and speed runs.
//!
//! Imports run one way: `segment` → `layers` → `kv` → `plan` → `upload` → `context` →
//! `attention_kv`, `coop` → `pipeline`, `pack`, `options` (each may also skip down).
//!
//! Kernels live in `kernels/wgsl/*.wgsl`, each with a header describing its bindings and layout.
//! Weights stay GGUF block bytes in storage buffers (Q4_0 / Q4_1 / Q8_0 repacked at upload into
//! aligned quant words and scales, `pack`) and are decoded in the shader; the repacked types
//! multiply activations quantized to 8 bits by integer dot products as the CPU does, other types
//! f32 activations, and on adapters with tensor cores Q4_0 multiplies f16 operands on them
//! (`coop`): results differ from the CPU backend's by that rounding, with the tolerances stated
//! in the tests. Every
//! reduction has a fixed order that does not depend on the batch, so on this backend a token's
//! outputs are bitwise the same in decode and prefill.

mod attention_kv;
mod backend;
mod context;
mod coop;
mod kernel_src;
mod kv;
mod layers;
mod options;
mod pack;
mod pipeline;
mod plan;
mod segment;
mod upload;

#[cfg(test)]
mod coop_probe;
#[cfg(test)]
mod coop_tile_probe;
#[cfg(test)]
mod probe;
#[cfg(test)]
mod stress;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod model_tests;

use super::offload::OffloadError;

pub use backend::WgpuBackend;
pub use context::{AdapterSummary, WgpuContext, WEIGHT_TYPES};
pub use options::{DecodePlan, WgpuOptions};
pub use kv::KvPrecision;
pub use layers::{layers_unsupported, GpuLayers};
pub use segment::WgpuLayers;

/// The process's one wgpu instance, created at first use and never dropped. Dropping the last
/// instance lets the Vulkan loader unload the driver, and NVIDIA's driver leaves thread-exit
/// destructors behind in every thread that touched it: a thread that outlives the unload then
/// jumps into unmapped code when it exits (seen on the H100 as a segfault at the end of a test
/// thread that had only probed for an adapter while another thread dropped its context).
pub(crate) fn instance() -> &'static wgpu::Instance {
    static INSTANCE: std::sync::LazyLock<wgpu::Instance> =
        std::sync::LazyLock::new(|| wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle()));
    &INSTANCE
}

#[derive(Debug, thiserror::Error)]
pub enum WgpuError {
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    #[error("could not open the GPU device: {0}")]
    Device(String),
    #[error("kernel {kernel} failed to compile: {msg}")]
    Shader { kernel: String, msg: String },
    #[error("GPU error: {0}")]
    Gpu(String),
    #[error("{what}: {bytes} bytes exceed the adapter's storage binding limit of {max}")]
    TooLarge { what: String, bytes: u64, max: u64 },
    #[error("not supported on the wgpu backend: {0}")]
    Unsupported(String),
    #[error("batch of {got} tokens exceeds the layer runner's {max}")]
    BatchTooLarge { got: usize, max: usize },
    #[error("positions must continue the sequence at {expected}, got {got}")]
    BadPositions { expected: usize, got: u32 },
    #[error("sequence would reach position {needed}, KV capacity is {capacity}")]
    ContextFull { needed: usize, capacity: usize },
    #[error("hidden state has {got} values, expected {expected}")]
    BadShape { got: usize, expected: usize },
}

impl From<WgpuError> for OffloadError {
    fn from(e: WgpuError) -> OffloadError {
        OffloadError { backend: "wgpu", source: Box::new(e) }
    }
}

impl WgpuError {
    /// The machine has no usable GPU (no adapter, or its device would not open): the CPU serves.
    /// Anything else from building a context (a kernel that fails to compile, ...) is our bug,
    /// and tests must fail on it rather than skip.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, WgpuError::NoAdapter(_) | WgpuError::Device(_))
    }
}
