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
