//! End to end on the HIP tier, real SmolLM2: every layer and the output head on the HIP device
//! (`--backend hip`), and a three-way split (CPU, wgpu and HIP layers in one model), through
//! `Model::forward` as the service runs it. Greedy tokens must equal the CPU backend's on the
//! reference prompts of `../shared/reference/smollm2_greedy.jsonl`, up to near-ties: at a
//! divergence the CPU's top-2 margin is printed, equality is required where it is at least the
//! margin named below, and comparison of that prompt stops there.
//!
//! HIP quantizes activations to q8 exactly as the CPU does, so its logits differ from the CPU's
//! only by float summation order: MARGIN is the CPU-only noise threshold, 0.3. The three-way
//! split also has wgpu layers (f32 activations), so it takes wgpu_split.rs's 0.5.
//! Without a HIP device (no AMD GPU / libamdhip64, no NVIDIA driver / nvcc) these print why and
//! pass (`FORGE_HIP_REQUIRED=1`: fail instead); the split test also needs a wgpu adapter
//! (software allowed).

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::backend::hip::HipContext;
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::placement::{place, BackendChoice, PlacementOptions};
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::Model;

const TOKENS: usize = 32;

fn hip_present() -> bool {
    match HipContext::get() {
        Ok(c) => {
            eprintln!("HIP device: {}", c.describe());
            true
        }
        Err(e) => {
            assert!(e.is_unavailable(), "HIP detection failed loudly: {e}");
            assert!(std::env::var_os("FORGE_HIP_REQUIRED").is_none(), "FORGE_HIP_REQUIRED is set and there is no HIP device: {e}");
            eprintln!("skipped: no HIP device ({e})");
            false
        }
    }
}

fn placed(backend: BackendChoice, split: Option<&str>) -> Model {
    let mut model = Model::load(common::smollm2_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load");
    let opts = PlacementOptions { backend, split: split.map(|s| s.parse().expect("split")), allow_software: true };
    let p = place(&mut model, &opts).expect("place");
    eprintln!("{p}: {}", model.placement());
    model
}

fn greedy(model: &Model, prompt: &[u32], stop: &[u32], n: usize) -> Vec<u32> {
    let mut state = model.new_state(prompt.len());
    let params = GenerateParams { max_tokens: n, sampling: SamplingParams::greedy(), stop_ids: stop.to_vec() };
    let g = generate(model, &mut state, prompt, &params, |_| ControlFlow::Continue(())).expect("generate");
    g.tokens.iter().copied().chain(g.stop_token).collect()
}

/// Greedy tokens of `model` against the CPU's on the reference prompts (all, or those without a
/// near tie in the first `n` steps); returns (tokens compared equal, prompts stopped at a near tie).
fn compare_with_cpu(model: &Model, cpu: &Model, margin: f32, n: usize, safe_only: bool) -> (usize, usize) {
    let stop = Tokenizer::from_gguf(&cpu.gguf).expect("tokenizer").stop_ids().to_vec();
    let (mut compared, mut near_ties) = (0, 0);
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        if safe_only && rec["safe_prefix_len"].as_u64().unwrap_or(0) < n as u64 {
            continue;
        }
        let id = rec["id"].as_str().unwrap_or("?").to_string();
        let prompt = common::ids(&rec["prompt_tokens"]);
        let want = greedy(cpu, &prompt, &stop, n);
        let got = greedy(model, &prompt, &stop, n);
        match want.iter().zip(&got).position(|(a, b)| a != b) {
            None => {
                assert_eq!(want.len(), got.len(), "{id}: same tokens but different lengths");
                compared += want.len();
                eprintln!("{id:>12}: all {} tokens equal", want.len());
            }
            Some(i) => {
                let ctx: Vec<u32> = prompt.iter().chain(&want[..i]).copied().collect();
                let m = common::top2_margin(cpu, &ctx);
                eprintln!("{id:>12}: step {i}: cpu {} vs {}, CPU top-2 margin {m:.3}", want[i], got[i]);
                assert!(m < margin, "{id}: diverges at step {i} where the CPU is confident (margin {m:.3})");
                compared += i;
                near_ties += 1;
            }
        }
    }
    (compared, near_ties)
}

#[test]
fn hip_greedy_matches_cpu_on_reference_prompts() {
    if !hip_present() {
        return;
    }
    let cpu = placed(BackendChoice::Cpu, None);
    let hip = placed(BackendChoice::Hip, None);
    let (compared, near_ties) = compare_with_cpu(&hip, &cpu, 0.3, TOKENS, false);
    eprintln!("hip vs cpu: {compared} greedy tokens equal, {near_ties} prompts stopped at a near tie");
    assert!(compared >= 14 * 8, "too few tokens compared: {compared}");
}

#[test]
fn three_way_split_matches_cpu() {
    if !hip_present() {
        return;
    }
    match forge_cache::backend::wgpu::WgpuContext::new(forge_cache::backend::wgpu::WgpuOptions { allow_software: true, ..Default::default() }) {
        Err(e) if e.is_unavailable() => return eprintln!("skipped: no wgpu adapter ({e})"),
        Err(e) => panic!("wgpu context: {e}"),
        Ok(_) => {}
    }
    let cpu = placed(BackendChoice::Cpu, None);
    // every hand-off: CPU -> wgpu -> HIP (head on HIP), and HIP -> CPU -> wgpu (head on wgpu)
    let mut total = 0;
    for split in ["cpu:10,igpu:10,dgpu:10", "dgpu:8,cpu:12,igpu:10"] {
        let model = placed(BackendChoice::Split, Some(split));
        let (compared, _) = compare_with_cpu(&model, &cpu, 0.5, 16, true);
        eprintln!("{split}: {compared} greedy tokens equal to the CPU's");
        total += compared;
    }
    assert!(total >= 2 * 4 * 16 / 2, "too few tokens compared: {total}");
}
