//! Generates the gRPC code (tonic + prost) and the encoded file descriptor set that server
//! reflection serves, from `proto/forge/v1/forge.proto`.
//!
//! `protoc` comes from the `protoc-bin-vendored` crate (Google's release binaries for Linux, macOS and
//! Windows on x86-64 and aarch64), so a fresh machine needs nothing beyond a Rust toolchain. A `PROTOC`
//! set in the environment still wins, for platforms the crate does not cover.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/forge/v1/forge.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // Undecodable requests are INVALID_ARGUMENT, not tonic-prost's INTERNAL (src/server/codec.rs).
        .codec_path("crate::server::codec::ForgeCodec")
        .file_descriptor_set_path(out.join("forge_descriptor.bin"))
        .compile_protos(&["proto/forge/v1/forge.proto"], &["proto"])?;
    Ok(())
}
