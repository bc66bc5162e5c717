//! Gemma 3 270M with its layers on the wgpu tier (lavapipe in CI): GeGLU, NeoX RoPE, q/k norms,
//! post-attention and post-FFN norms, interleaved sliding-window layers with their own RoPE base
//! and queries wider than the residual stream, through `Model::forward` and `generate`.
//!
//! Gemma's tied 262k x 640 output head is larger than lavapipe's largest storage buffer (128
//! MiB), so the last layer and the head stay on the CPU in these runs: `igpu:17,cpu:1` (every
//! other layer on wgpu) and `cpu:6,igpu:6,cpu:6` (hand-offs both ways). Against the CPU alone: the
//! greedy tokens of the reference prompts (`../shared/reference/gemma3_greedy.jsonl`, within their
//! `safe_prefix_len`, where llama.cpp's own top-2 margins have no near tie) are equal, and the
//! logits of the prompt's last token are within [`TOL`] of their scale. Without any adapter it
//! prints a message and passes.

mod common;

use std::ops::ControlFlow;

use forge_cache::backend::wgpu::{WgpuContext, WgpuOptions};
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::placement::{place, BackendChoice, PlacementOptions};
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::{Logits, Model, SeqBatch};

/// Greedy tokens compared per prompt.
const TOKENS: usize = 8;
const PROMPTS: usize = 2;
/// Largest difference of the last prompt token's logits from the CPU's, as a fraction of the CPU
/// logits' largest magnitude: the GPU multiplies Q4_K / Q6_K rows by f32 activations, the CPU by
/// 8-bit ones (see tests/wgpu_split.rs). Measured on lavapipe: 0.63 to 0.94 of scales 20-23
/// (2.8% to 4.5%), the size of SmolLM2's between the tiers (0.84); a layer part left out moves
/// them by far more (the synthetic models in src/backend/wgpu/tests.rs check each part).
const TOL: f32 = 0.08;

fn placed(split: Option<&str>) -> Model {
    let mut model = common::gemma3_model();
    let backend = if split.is_some() { BackendChoice::Split } else { BackendChoice::Cpu };
    let opts = PlacementOptions { backend, split: split.map(|s| s.parse().expect("split")), allow_software: true };
    let p = place(&mut model, &opts).expect("place");
    eprintln!("{p}: {}", model.placement());
    model
}

fn last_logits(model: &Model, prompt: &[u32]) -> Vec<f32> {
    let mut state = model.new_state(prompt.len());
    let mut kv = model.new_kv(prompt.len());
    model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: prompt, logits: Logits::Last }]).expect("forward");
    model.logits(&state, 0).to_vec()
}

fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = model.new_state(prompt.len());
    let params = GenerateParams { max_tokens: n, sampling: SamplingParams::greedy(), stop_ids: Vec::new() };
    generate(model, &mut state, prompt, &params, |_| ControlFlow::Continue(())).expect("generate").tokens
}

#[test]
fn gemma3_layers_on_wgpu_match_the_cpu() {
    match WgpuContext::new(WgpuOptions { allow_software: true, ..WgpuOptions::default() }) {
        Err(e) if e.is_unavailable() => return eprintln!("skipped: {e}"),
        Err(e) => panic!("wgpu context: {e}"),
        Ok(_) => {}
    }
    let cpu = placed(None);
    let splits = [placed(Some("igpu:17,cpu:1")), placed(Some("cpu:6,igpu:6,cpu:6"))];
    assert_eq!(splits[0].gpu_layers(), Some(0..17));
    let recs = common::jsonl("gemma3_greedy.jsonl");
    let chosen: Vec<_> = recs.iter().filter(|r| r["safe_prefix_len"].as_u64().unwrap_or(0) >= TOKENS as u64).take(PROMPTS).collect();
    assert_eq!(chosen.len(), PROMPTS, "reference prompts with {TOKENS} safe steps");
    for rec in chosen {
        let id = rec["id"].as_str().unwrap_or("?");
        let prompt = common::ids(&rec["prompt_tokens"]);
        let (want, on_cpu) = (last_logits(&cpu, &prompt), greedy(&cpu, &prompt, TOKENS));
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for split in &splits {
            let got = last_logits(split, &prompt);
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            eprintln!("{id}: {}: max |split - cpu| logit {worst:.4} (scale {scale:.2})", split.placement());
            assert!(worst <= TOL * scale, "{id}: {}: logits differ by {worst} (scale {scale})", split.placement());
            assert_eq!(greedy(split, &prompt, TOKENS), on_cpu, "{id}: {}: greedy tokens", split.placement());
        }
    }
}
