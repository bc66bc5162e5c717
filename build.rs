//! Generates the gRPC code (tonic + prost) and the encoded file descriptor set that server
//! reflection serves, from `proto/forge/v1/forge.proto`; with the `hip` feature, compiles
//! `kernels/hip` for AMD GPUs with `hipcc` (see [`hip_kernels`]).
//!
//! `protoc` comes from the `protoc-bin-vendored` crate (Google's release binaries for Linux, macOS and
//! Windows on x86-64 and aarch64), so a fresh machine needs nothing beyond a Rust toolchain. A `PROTOC`
//! set in the environment still wins, for platforms the crate does not cover.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `--offload-arch` Debian bookworm's HIP 5.2 (clang 15) compiles these kernels for: GCN 3
/// (gfx8), GCN 5 / CDNA (gfx9: gfx90a is the MI200), RDNA 1 and RDNA 2 (gfx10: gfx1030 is the RX
/// 6800/6900). gfx7 fails (no `ds_bpermute` for the warp shuffles) and gfx11 (RDNA 3) has no device
/// library in that release. `FORGE_HIP_ARCHS` (comma-separated) overrides the list.
const AMD_ARCHS: &[&str] = &[
    "gfx801", "gfx802", "gfx803", "gfx805", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a",
    "gfx90c", "gfx940", "gfx1010", "gfx1011", "gfx1012", "gfx1013", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034",
    "gfx1035", "gfx1036",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/forge/v1/forge.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Undecodable requests are INVALID_ARGUMENT, not tonic-prost's INTERNAL (src/server/codec.rs).
        .codec_path("crate::server::codec::ForgeCodec")
        .file_descriptor_set_path(out.join("forge_descriptor.bin"))
        .compile_protos(&["proto/forge/v1/forge.proto"], &["proto"])?;
    hip_kernels(&out)?;
    Ok(())
}

/// Writes `$OUT_DIR/hip_amd.co` (a clang offload bundle with one code object per target, which
/// `hipModuleLoadData` picks from) and `$OUT_DIR/hip_amd.txt` (the targets, or why there are none).
/// Only with the `hip` feature and a `hipcc` on the PATH (or `$HIPCC`); otherwise both are written
/// empty / with the reason, and the AMD runtime says so at run time. A failing compile fails the
/// build: the kernels must always compile for every target listed.
fn hip_kernels(out: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new("kernels/hip");
    println!("cargo:rerun-if-changed=kernels/hip");
    for e in std::fs::read_dir(dir)? {
        println!("cargo:rerun-if-changed={}", e?.path().display());
    }
    println!("cargo:rerun-if-env-changed=HIPCC");
    println!("cargo:rerun-if-env-changed=FORGE_HIP_ARCHS");
    let (co, txt) = (out.join("hip_amd.co"), out.join("hip_amd.txt"));
    let none = |why: &str| -> Result<(), Box<dyn std::error::Error>> {
        std::fs::write(&co, b"")?;
        std::fs::write(&txt, why)?;
        Ok(())
    };
    if std::env::var_os("CARGO_FEATURE_HIP").is_none() {
        return none("built without the `hip` feature");
    }
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".to_string());
    if Command::new(&hipcc).arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        println!("cargo:warning=forge-cache: feature `hip` without `{hipcc}`: no AMD code objects are embedded");
        return none("hipcc was not found when this binary was built");
    }
    let archs: Vec<String> = match std::env::var("FORGE_HIP_ARCHS") {
        Ok(s) => s.split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect(),
        Err(_) => AMD_ARCHS.iter().map(|a| a.to_string()).collect(),
    };
    let mut cmd = Command::new(&hipcc);
    cmd.args(["--genco", "-O3", "-Wno-unused-command-line-argument"]);
    for a in &archs {
        cmd.arg(format!("--offload-arch={a}"));
    }
    cmd.arg(dir.join("all.hip")).arg("-o").arg(&co);
    let o = cmd.output()?;
    if !o.status.success() {
        return Err(format!("hipcc failed on kernels/hip/all.hip:\n{}", String::from_utf8_lossy(&o.stderr)).into());
    }
    std::fs::write(&txt, archs.join(","))?;
    Ok(())
}
