//! The kernels' code objects. On AMD: the bundle build.rs compiled with `hipcc --genco` for every
//! target it lists, embedded in the binary. On NVIDIA: the same `.hip` sources, shipped in the
//! binary, compiled on first use by `nvcc -x cu --cubin -arch=sm_XY` for the GPU found, and kept
//! in a cache directory keyed by the sources, the target and the compiler, so later processes
//! load it at once.
//!
//! Why at run time rather than by a script on the GPU machine: nothing about CUDA is needed to
//! build the binary, one binary serves every NVIDIA architecture (the kernels are built for the
//! GPU actually present), and the sources that run are by construction the ones in the binary.

use std::path::PathBuf;
use std::process::Command;

use sha2::{Digest, Sha256};

use super::runtime::{Platform, Runtime};
use super::HipError;

/// kernels/hip, as shipped in the binary (`all.hip` includes the others).
pub const SOURCES: &[(&str, &str)] = &[
    ("common.h", include_str!("../../../kernels/hip/common.h")),
    ("quants.hip", include_str!("../../../kernels/hip/quants.hip")),
    ("matmul.hip", include_str!("../../../kernels/hip/matmul.hip")),
    ("norm.hip", include_str!("../../../kernels/hip/norm.hip")),
    ("rope.hip", include_str!("../../../kernels/hip/rope.hip")),
    ("attention.hip", include_str!("../../../kernels/hip/attention.hip")),
    ("elementwise.hip", include_str!("../../../kernels/hip/elementwise.hip")),
    ("all.hip", include_str!("../../../kernels/hip/all.hip")),
];

/// build.rs's AMD bundle (empty without the `hip` feature or without hipcc).
const AMD_CODE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hip_amd.co"));
/// Its targets, comma-separated, or why there is no bundle.
const AMD_TARGETS: &str = include_str!(concat!(env!("OUT_DIR"), "/hip_amd.txt"));

/// The AMD targets compiled into this binary, or why there are none.
pub fn amd_targets() -> Result<&'static str, &'static str> {
    if AMD_CODE.is_empty() {
        Err(AMD_TARGETS)
    } else {
        Ok(AMD_TARGETS)
    }
}

/// The code object for `rt`'s GPU.
pub fn code_object(rt: &dyn Runtime) -> Result<Vec<u8>, HipError> {
    match rt.platform() {
        Platform::Amd => match amd_targets() {
            Ok(_) => Ok(AMD_CODE.to_vec()),
            Err(why) => Err(HipError::Unavailable(format!("no AMD code objects in this binary: {why}"))),
        },
        Platform::Nvidia => nvcc_cubin(&rt.arch()),
    }
}

/// `$FORGE_NVCC`, else `nvcc` on the PATH, else the usual CUDA roots.
fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FORGE_NVCC") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = std::env::var_os(var) {
            candidates.push(PathBuf::from(root).join("bin/nvcc"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin/nvcc"));
    candidates.into_iter().find(|p| p.is_file())
}

/// `$FORGE_HIP_CACHE`, else `$XDG_CACHE_HOME/forge-cache/hip`, else `~/.cache/forge-cache/hip`,
/// else a folder in the temporary directory.
fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("FORGE_HIP_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("forge-cache/hip");
    }
    if let Some(p) = std::env::var_os("HOME") {
        return PathBuf::from(p).join(".cache/forge-cache/hip");
    }
    std::env::temp_dir().join("forge-cache-hip")
}

fn nvcc_cubin(arch: &str) -> Result<Vec<u8>, HipError> {
    let nvcc = find_nvcc().ok_or_else(|| HipError::Unavailable("no nvcc to build the kernels for this NVIDIA GPU (set FORGE_NVCC or put nvcc on the PATH)".into()))?;
    let version = Command::new(&nvcc).arg("--version").output().map_err(|e| HipError::Unavailable(format!("{}: {e}", nvcc.display())))?;
    let mut h = Sha256::new();
    for (name, src) in SOURCES {
        h.update(name.as_bytes());
        h.update(src.as_bytes());
    }
    h.update(arch.as_bytes());
    h.update(&version.stdout);
    let key: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let dir = cache_dir();
    let cubin = dir.join(format!("forge-{key}-{arch}.cubin"));
    if let Ok(bytes) = std::fs::read(&cubin) {
        return Ok(bytes);
    }
    let src = dir.join(format!("src-{key}-{}", std::process::id()));
    let io = |e: std::io::Error| HipError::Unavailable(format!("kernel cache {}: {e}", dir.display()));
    std::fs::create_dir_all(&src).map_err(io)?;
    for (name, text) in SOURCES {
        std::fs::write(src.join(name), text).map_err(io)?;
    }
    let t0 = std::time::Instant::now();
    let tmp = src.join("all.cubin");
    let out = Command::new(&nvcc)
        .current_dir(&src)
        .args(["-x", "cu", "--cubin", "-O3", &format!("-arch={arch}"), "-o"])
        .arg(&tmp)
        .arg("all.hip")
        .output()
        .map_err(|e| HipError::Unavailable(format!("{}: {e}", nvcc.display())))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&src);
        return Err(HipError::Compile(format!("nvcc -arch={arch} kernels/hip/all.hip:\n{}", String::from_utf8_lossy(&out.stderr))));
    }
    let bytes = std::fs::read(&tmp).map_err(io)?;
    // rename is atomic: a concurrent process either finds the whole file or compiles its own
    std::fs::rename(&tmp, &cubin).map_err(io)?;
    let _ = std::fs::remove_dir_all(&src);
    tracing::info!(arch = %arch, nvcc = %nvcc.display(), secs = t0.elapsed().as_secs_f64(), cubin = %cubin.display(), "HIP tier: built the kernels");
    Ok(bytes)
}

