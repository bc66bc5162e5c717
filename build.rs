//! Generates the gRPC code (tonic + prost) and the encoded file descriptor set that server
//! reflection serves, from `proto/forge/v1/forge.proto`. Needs `protoc` (Debian: protobuf-compiler).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("forge_descriptor.bin"))
        .compile_protos(&["proto/forge/v1/forge.proto"], &["proto"])?;
    Ok(())
}
