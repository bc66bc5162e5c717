//! Truncated and corrupted copies of the real SmolLM2 GGUF: every one is a clear error from
//! `Model::load`, never a panic or an out-of-bounds read. (Corrupt safetensors: src/embed/tests.rs;
//! hand-built GGUF files of every metadata type: src/gguf/writer.rs.)

mod common;

use std::io::Write;
use std::sync::Arc;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::{Model, ModelError};
use forge_cache::gguf::{writer::GgufWriter, GgmlType, Value};

fn load_bytes(bytes: &[u8]) -> Result<Model, ModelError> {
    let mut f = tempfile::NamedTempFile::new().expect("tmp");
    f.write_all(bytes).expect("write");
    Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool")))
}

#[test]
fn truncated_copies_of_the_real_model_are_errors() {
    let bytes = std::fs::read(common::smollm2_path()).expect("read model");
    let len = bytes.len();
    for cut in [0, 3, 4, 8, 20, 1000, 500_000, 1_700_000, 1_785_000, 1_790_000, len / 2, len - 1] {
        let err = load_bytes(&bytes[..cut]).err().unwrap_or_else(|| panic!("cut at {cut} loaded"));
        eprintln!("cut at {cut:>9}: {err}");
    }
}

#[test]
fn corrupted_fields_of_the_real_model_are_errors() {
    let bytes = std::fs::read(common::smollm2_path()).expect("read model");
    let mut b = bytes[..].to_vec();
    b[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(load_bytes(&b).err().expect("version").to_string().contains("version 7"));

    let mut b = bytes.clone();
    b[8..16].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(load_bytes(&b).err().expect("tensor count").to_string().contains("tensor count"));

    // The type id of the first tensor info ("token_embd.weight", after the metadata).
    let at = bytes.windows(17).position(|w| w == b"token_embd.weight").expect("tensor name");
    let ty = at + 17 + 4 + 2 * 8;
    let mut b = bytes.clone();
    b[ty..ty + 4].copy_from_slice(&77u32.to_le_bytes());
    let e = load_bytes(&b).err().expect("type").to_string();
    assert!(e.contains("token_embd.weight") && e.contains("77"), "{e}");

    // Its first dimension changed: the shape no longer matches the hyper-parameters.
    let mut b = bytes.clone();
    b[at + 21..at + 29].copy_from_slice(&608u64.to_le_bytes());
    assert!(load_bytes(&b).is_err());
}

#[test]
fn valid_gguf_that_is_not_a_runnable_model_is_an_error() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("gpt2".into()));
    let e = load_bytes(&w.to_bytes()).err().expect("arch").to_string();
    assert!(e.contains("gpt2"), "{e}");

    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("llama.embedding_length", Value::U32(64))
        .meta("llama.attention.head_count", Value::U32(4))
        .meta("llama.block_count", Value::U32(1))
        .meta("llama.feed_forward_length", Value::U32(128))
        .meta("llama.context_length", Value::U32(128))
        .meta("llama.vocab_size", Value::U32(10))
        .meta("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .tensor("token_embd.weight", &[64, 10], GgmlType::F32, vec![0; 64 * 10 * 4]);
    let e = load_bytes(&w.to_bytes()).err().expect("missing tensors").to_string();
    assert!(e.contains("missing tensor blk.0.attn_norm.weight"), "{e}");
}

/// A file of a known architecture with a tensor it does not use, or a weight type the engine
/// cannot run, is refused with an error that names it (not "corrupt"); an architecture the GPU
/// layers cannot run stays on the CPU under the automatic split and is refused when asked for.
#[test]
fn unknown_architecture_tensor_and_type_are_named() {
    use forge_cache::engine::placement::{place, BackendChoice, Device, PlacementOptions};
    use forge_cache::gguf::synth::{write_synth_model, SynthArch, SynthQuant, SynthShape};
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g.gguf");
    write_synth_model(&SynthShape::small(SynthArch::Gemma3), SynthQuant::All(GgmlType::Q8_0), 1, None, &path, |_| {}).expect("write");
    let bytes = std::fs::read(&path).expect("read");

    // general.architecture "gemma3" -> "mamba3" (same length: the header stays valid).
    let at = bytes.windows(6).position(|w| w == b"gemma3").expect("arch value");
    let mut b = bytes.clone();
    b[at..at + 6].copy_from_slice(b"mamba3");
    let e = load_bytes(&b).err().expect("unknown architecture").to_string();
    assert!(e.contains("\"mamba3\"") && e.contains("not supported") && e.contains("gemma3") && !e.contains("corrupt"), "{e}");

    // Every tensor of the file, and one more that a Gemma 3 model does not have.
    let g = forge_cache::gguf::GgufFile::open(&path).expect("open");
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        w.meta(k, v.clone());
    }
    for t in &g.tensors {
        w.tensor(&t.name, &t.dims, t.ty, g.data(t).to_vec());
    }
    w.tensor("blk.0.attn_q.bias", &[512], GgmlType::F32, vec![0; 512 * 4]);
    let e = load_bytes(&w.to_bytes()).err().expect("unknown tensor").to_string();
    assert!(e.contains("blk.0.attn_q.bias") && e.contains("gemma3") && e.contains("unknown tensor"), "{e}");

    // The first weight's type id set to IQ4_XS (23), a GGML type the engine does not run.
    let at = bytes.windows(17).position(|w| w == b"token_embd.weight").expect("tensor name");
    let ty = at + 17 + 4 + 2 * 8;
    let mut b = bytes.clone();
    b[ty..ty + 4].copy_from_slice(&23u32.to_le_bytes());
    let e = load_bytes(&b).err().expect("type").to_string();
    assert!(e.contains("token_embd.weight") && e.contains("IQ4_XS"), "{e}");

    // The GPU tiers: wgpu runs all of Gemma 3's layer parts; HIP lacks them, so the automatic
    // split (which keeps a model either tier refuses on the CPU) still does, and an explicit HIP
    // request says why.
    let mut model = load_bytes(&bytes).expect("loads");
    use forge_cache::engine::placement::{layers_unsupported, tier_unsupported};
    assert!(layers_unsupported(&model).is_some_and(|why| why.contains("gemma3") && why.contains("sliding-window layers")));
    assert_eq!(tier_unsupported(&model, Device::Igpu), None);
    let hip_why = tier_unsupported(&model, Device::Dgpu).expect("HIP refuses");
    assert!(hip_why.contains("GeGLU") && hip_why.contains("NeoX RoPE") && hip_why.contains("HIP"), "{hip_why}");
    let split = PlacementOptions { backend: BackendChoice::Split, split: None, allow_software: true };
    let p = place(&mut model, &split).expect("automatic split");
    assert!(p.runs.iter().all(|(d, _)| *d == Device::Cpu) && p.reason.contains("gemma3"), "{}", p.reason);
    // The HIP tier too (refused by the shape before any device is looked for).
    let hip = PlacementOptions { backend: BackendChoice::Hip, split: None, allow_software: true };
    let e = place(&mut model, &hip).expect_err("refused").to_string();
    assert!(e.contains("cannot run") && e.contains("gemma3") && e.contains("GeGLU"), "{e}");
}
