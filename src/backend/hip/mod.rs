//! The HIP tier: a discrete GPU running whole layers through the layer-offload interface
//! (`backend::offload::LayerOffload`), with kernels written once in `kernels/hip/*.hip`.
//!
//! * `runtime` — the one small runtime interface (load a code object, get a function, allocate,
//!   copy, launch, synchronize) with two implementations: HIP on AMD (`amd`, feature `hip`:
//!   `hip-sys`'s API types, libamdhip64 opened at run time) and the CUDA driver API on NVIDIA
//!   (`cuda`, libcuda opened at run time). Everything else is the same code on both.
//! * `module` — the code objects: build.rs's `hipcc --genco` bundle on AMD; on NVIDIA the same
//!   sources compiled by `nvcc` on first use and cached.
//! * `kernels` — the kernels resolved from the module and their launches.
//! * `layers` — [`HipLayers`], the `LayerOffload` segment; `kv` — one sequence's cache.
//! * `backend` — [`HipBackend`], the `Backend` trait op by op (for the kernel tests).
//!
//! [`HipContext::get`] opens the device once per process. It never fails loudly: without an AMD
//! GPU, libamdhip64, libcuda or nvcc it returns the reason (`forge-cache hardware` prints it),
//! and the engine runs on the other tiers.
//!
//! Batch invariance holds as on the CPU: every kernel computes a token's values in an order that
//! depends only on the shapes and the token's position (see kernels/hip/matmul.hip and
//! attention.hip), so decode equals prefill bitwise.

#[cfg(feature = "hip")]
mod amd;
mod backend;
mod cuda;
pub mod kernels;
mod kv;
mod layers;
pub mod module;
pub mod runtime;
#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};

pub use backend::HipBackend;
pub use kernels::{AttGroup, Tile};
pub use kv::HipKv;
pub use layers::{layers_unsupported, HipActs, HipLayers};

use crate::backend::offload::OffloadError;
use kernels::Kernels;
use runtime::{Platform, Runtime};

#[derive(Debug, thiserror::Error)]
pub enum HipError {
    /// No usable device (no GPU, no runtime library, no kernels for it): the reason.
    #[error("{0}")]
    Unavailable(String),
    #[error("{call}: {message}")]
    Api { call: &'static str, code: i32, message: String },
    #[error("building the kernels: {0}")]
    Compile(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("sequence would reach position {needed}, KV capacity is {capacity}")]
    ContextFull { needed: usize, capacity: usize },
}

impl HipError {
    /// Whether this says there is no usable device (as opposed to a failure on one).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, HipError::Unavailable(_))
    }
}

impl From<HipError> for OffloadError {
    fn from(e: HipError) -> OffloadError {
        OffloadError { backend: "hip", source: Box::new(e) }
    }
}

/// The HIP knobs, from `FORGE_HIP_*` (unset: defaults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HipOptions {
    /// `FORGE_HIP=off`: never use a HIP device.
    pub off: bool,
    /// `FORGE_HIP_TILE=t1|t4|t8|t16|mma|mma64`: one matmul tile for every step (all give the same bits).
    pub tile: Option<Tile>,
    /// `FORGE_HIP_GRAPHS=off`: launch every kernel of a step instead of replaying a recorded
    /// graph of them (same kernels, same bits; graphs save the launch overhead).
    pub no_graphs: bool,
}

impl HipOptions {
    pub fn from_env() -> Result<HipOptions, HipError> {
        let off = std::env::var("FORGE_HIP").is_ok_and(|v| v.eq_ignore_ascii_case("off") || v == "0");
        let tile = match std::env::var("FORGE_HIP_TILE").ok().as_deref() {
            None | Some("") => None,
            Some("t1") => Some(Tile::T1),
            Some("t4") => Some(Tile::T4),
            Some("t8") => Some(Tile::T8),
            Some("t16") => Some(Tile::T16),
            Some("mma") => Some(Tile::Mma),
            Some("mma64") => Some(Tile::Mma64),
            Some(v) => return Err(HipError::Unsupported(format!("FORGE_HIP_TILE={v:?}: expected t1, t4, t8, t16, mma or mma64"))),
        };
        let no_graphs = std::env::var("FORGE_HIP_GRAPHS").is_ok_and(|v| v.eq_ignore_ascii_case("off") || v == "0");
        Ok(HipOptions { off, tile, no_graphs })
    }
}

/// One HIP device with its kernels loaded.
pub struct HipContext {
    rt: Arc<dyn Runtime>,
    k: Kernels,
    /// Held by whatever puts work on the runtime's one stream (a step, a cache's allocation or
    /// copy, a test op), so that a step recorded into a graph records only its own kernels.
    stream: std::sync::Mutex<()>,
}

impl HipContext {
    /// The process's HIP device, opened once (AMD first, then NVIDIA), or why there is none.
    pub fn get() -> Result<Arc<HipContext>, HipError> {
        static CTX: OnceLock<Result<Arc<HipContext>, String>> = OnceLock::new();
        if HipOptions::from_env().is_ok_and(|o| o.off) {
            return Err(HipError::Unavailable("FORGE_HIP=off".into()));
        }
        CTX.get_or_init(|| HipContext::open().map(Arc::new).map_err(|e| e.to_string())).clone().map_err(HipError::Unavailable)
    }

    fn open() -> Result<HipContext, HipError> {
        let mut why = Vec::new();
        #[cfg(feature = "hip")]
        match amd::AmdRuntime::open() {
            Ok(rt) => return HipContext::with_runtime(Arc::new(rt)),
            Err(e) => why.push(format!("AMD: {e}")),
        }
        #[cfg(not(feature = "hip"))]
        why.push("AMD: this binary was built without the `hip` feature".to_string());
        match cuda::CudaRuntime::open() {
            Ok(rt) => return HipContext::with_runtime(Arc::new(rt)),
            Err(e) => why.push(format!("NVIDIA: {e}")),
        }
        Err(HipError::Unavailable(why.join("; ")))
    }

    fn with_runtime(rt: Arc<dyn Runtime>) -> Result<HipContext, HipError> {
        let name = rt.device_name();
        let image = module::code_object(&*rt).map_err(|e| HipError::Unavailable(format!("{name}: {e}")))?;
        let m = rt.load_module(&image).map_err(|e| HipError::Unavailable(format!("{name}: loading the kernels: {e}")))?;
        let k = Kernels::load(&rt, m).map_err(|e| HipError::Unavailable(format!("{name}: {e}")))?;
        Ok(HipContext { rt, k, stream: std::sync::Mutex::new(()) })
    }

    /// Exclusive use of the stream (see the field).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn runtime(&self) -> &Arc<dyn Runtime> {
        &self.rt
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.k
    }

    /// e.g. "NVIDIA H100 80GB HBM3 (sm_90, CUDA driver)".
    pub fn describe(&self) -> String {
        let api = match self.rt.platform() {
            Platform::Amd => "HIP",
            Platform::Nvidia => "CUDA driver",
        };
        let arch = self.rt.arch();
        let name = self.rt.device_name();
        if arch == name {
            format!("{name} ({api})")
        } else {
            format!("{name} ({arch}, {api})")
        }
    }
}

/// One line for `forge-cache hardware`: the device the HIP tier would use, or why none.
pub fn status() -> String {
    match HipContext::get() {
        Ok(c) => format!("{}, {:.1} GiB", c.describe(), c.rt.total_memory() as f64 / (1u64 << 30) as f64),
        Err(e) => format!("none: {e}"),
    }
}
