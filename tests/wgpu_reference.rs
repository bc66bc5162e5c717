//! End to end on the wgpu tier: embedding on the CPU (`gguf::dequantize_row`), every layer on
//! [`WgpuLayers`], output norm and logits on the CPU backend, greedy decoding. The first 32 greedy
//! tokens must equal the CPU backend's (`engine::generate::generate`) on every reference prompt of
//! `../shared/reference/smollm2_greedy.jsonl`.
//!
//! The GPU computes matmuls on f32 activations, the CPU on GGML's 8-bit activations, so near-ties
//! may legitimately flip: at a divergence the CPU's top-2 margin is printed, equality is required
//! where it is at least [`MARGIN`] = 0.3 (the project's measured noise threshold, see
//! `tests/reference_smollm2.rs` and `scripts/reference-noise.py`), and comparison of that prompt
//! stops after a near-tie divergence. Software adapters are allowed, so this runs on lavapipe in
//! CI; without any adapter it prints a message and passes.
//!
//! `wgpu_speed` (ignored; run with `--ignored --nocapture`) measures prefill and decode tokens/s of
//! the CPU backend and of the wgpu tier on the models in `$FORGE_SPEED_MODELS` (comma-separated
//! GGUF paths; default SmolLM2) and prints a markdown table.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Instant;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::backend::wgpu::{WgpuContext, WgpuLayers, WgpuOptions};
use forge_cache::backend::Backend;
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::sampler::{argmax, SamplingParams};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::Model;
use forge_cache::gguf::dequantize_row;

const MARGIN: f32 = 0.3;
const TOKENS: usize = 32;

/// The test context: the service's options with the `FORGE_WGPU_*` variables applied (variants
/// for `wgpu_speed`), software adapters allowed.
fn context() -> Option<Arc<WgpuContext>> {
    match WgpuContext::new(WgpuOptions { allow_software: true, ..WgpuOptions::from_env().expect("FORGE_WGPU_*") }) {
        Ok(c) => {
            eprintln!("wgpu adapter: {:?}", c.adapter());
            Some(c)
        }
        Err(e) if e.is_unavailable() => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("wgpu context: {e}"),
    }
}

/// The wgpu tier of one model: CPU embedding and logits around GPU layers.
struct Tier<'a> {
    model: &'a Model,
    layers: WgpuLayers,
    /// [n_tok, n_embd] scratch
    hidden: Vec<f32>,
    /// [n_embd]
    normed: Vec<f32>,
    /// [vocab]
    logits: Vec<f32>,
}

impl<'a> Tier<'a> {
    fn new(ctx: Arc<WgpuContext>, model: &'a Model, max_tokens: usize, capacity: usize) -> Tier<'a> {
        let c = &model.config;
        let layers = WgpuLayers::new(ctx, model, 0..c.n_layer, max_tokens, capacity).expect("upload layers");
        Tier { model, layers, hidden: Vec::new(), normed: vec![0.0; c.n_embd], logits: vec![0.0; c.vocab_size] }
    }

    /// Runs `tokens` at the next positions; leaves the last token's logits in `self.logits`.
    fn step(&mut self, tokens: &[u32]) {
        let (m, e) = (self.model, self.model.config.n_embd);
        let emb = m.weights.token_embd.view(&m.gguf);
        self.hidden.resize(tokens.len() * e, 0.0);
        for (row, &t) in self.hidden.chunks_exact_mut(e).zip(tokens) {
            dequantize_row(emb.ty, emb.row(t as usize), row);
        }
        let start = self.layers.len() as u32;
        let pos: Vec<u32> = (start..start + tokens.len() as u32).collect();
        self.layers.forward(&mut self.hidden, &pos).expect("wgpu forward");
        let last = &self.hidden[(tokens.len() - 1) * e..];
        let b = m.backend();
        b.rmsnorm(last, &m.weights.output_norm, m.config.rms_eps, &mut self.normed);
        b.matmul(m.weights.output.view(&m.gguf), &self.normed, 1, &mut self.logits);
    }

    /// Greedy tokens after `prompt` (the stop token included when one ends it).
    fn greedy(&mut self, prompt: &[u32], max: usize, stop: &[u32]) -> Vec<u32> {
        self.layers.truncate(0);
        self.step(prompt);
        let mut out = Vec::new();
        loop {
            let next = argmax(&self.logits);
            out.push(next);
            if out.len() >= max || stop.contains(&next) {
                return out;
            }
            self.step(&[next]);
        }
    }
}


#[test]
fn wgpu_greedy_matches_cpu_on_reference_prompts() {
    let Some(ctx) = context() else { return };
    // The CPU side on the AVX2 level where the machine has it: on lavapipe the AVX-512 VNNI
    // level's logits (another float order) met the GPU's f32-activation logits at a CPU margin
    // of 0.528 on chat-4 step 18, above MARGIN; why the tiers differ that much there is open
    // (docs/perf.md, wgpu tier).
    let model = match forge_cache::backend::cpu::SimdLevel::available().into_iter().find(|l| *l == forge_cache::backend::cpu::SimdLevel::Avx2) {
        Some(level) => Model::load(common::smollm2_path(), Arc::new(CpuBackend::with_simd(0, level).expect("pool"))).expect("load SmolLM2"),
        None => common::fast_model(),
    };
    let stop = Tokenizer::from_gguf(&model.gguf).expect("tokenizer").stop_ids().to_vec();
    let mut state = model.new_state(256);
    let mut tier = Tier::new(ctx, &model, 256, 256);
    let (mut compared, mut near_ties) = (0, 0);
    let (mut t_cpu, mut t_gpu) = (0.0, 0.0);
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        let id = rec["id"].as_str().unwrap_or("?").to_string();
        let prompt = common::ids(&rec["prompt_tokens"]);
        let t0 = Instant::now();
        let params = GenerateParams { max_tokens: TOKENS, sampling: SamplingParams::greedy(), stop_ids: stop.clone() };
        let cpu = generate(&model, &mut state, &prompt, &params, |_| ControlFlow::Continue(())).expect("cpu generate");
        let cpu: Vec<u32> = cpu.tokens.iter().copied().chain(cpu.stop_token).collect();
        let t1 = Instant::now();
        let gpu = tier.greedy(&prompt, TOKENS, &stop);
        t_cpu += (t1 - t0).as_secs_f64();
        t_gpu += t1.elapsed().as_secs_f64();
        match cpu.iter().zip(&gpu).position(|(a, b)| a != b) {
            None => {
                assert_eq!(cpu.len(), gpu.len(), "{id}: same tokens but different lengths");
                compared += cpu.len();
                eprintln!("{id:>12}: all {} tokens equal", cpu.len());
            }
            Some(i) => {
                let ctx_tokens: Vec<u32> = prompt.iter().chain(&cpu[..i]).copied().collect();
                let margin = common::top2_margin(&model, &ctx_tokens);
                eprintln!("{id:>12}: step {i}: cpu {} vs wgpu {}, CPU top-2 margin {margin:.3}", cpu[i], gpu[i]);
                assert!(margin < MARGIN, "{id}: wgpu diverges at step {i} where the CPU is confident (margin {margin:.3})");
                compared += i;
                near_ties += 1;
            }
        }
    }
    eprintln!("wgpu vs cpu: {compared} greedy tokens equal, {near_ties} prompts stopped at a near-tie; cpu {t_cpu:.1} s, wgpu {t_gpu:.1} s");
    assert!(compared >= 14 * 8, "too few tokens compared: {compared}");
}

/// Tokens/s of prefill (`n_prompt` tokens, one call) and decode (`n_decode` greedy steps).
#[derive(Clone, Copy)]
struct Speed {
    prefill: f64,
    decode: f64,
}

impl Speed {
    fn best(a: Speed, b: Speed) -> Speed {
        Speed { prefill: a.prefill.max(b.prefill), decode: a.decode.max(b.decode) }
    }
}

fn cpu_speed(model: &Model, prompt: &[u32], n_decode: usize) -> Speed {
    let mut state = model.new_state(prompt.len());
    let params = GenerateParams { max_tokens: n_decode + 1, sampling: SamplingParams::greedy(), stop_ids: vec![] };
    let g = generate(model, &mut state, prompt, &params, |_| ControlFlow::Continue(())).expect("generate");
    Speed { prefill: g.prefill_tok_s(), decode: g.decode_tok_s() }
}

/// (whole step: CPU embedding + GPU layers + CPU logits, layers alone) of the wgpu tier.
fn wgpu_speed_of(tier: &mut Tier<'_>, prompt: &[u32], n_decode: usize) -> (Speed, Speed) {
    let e = tier.model.config.n_embd;
    tier.layers.truncate(0);
    let t0 = Instant::now();
    tier.step(prompt);
    let prefill = t0.elapsed().as_secs_f64();
    let mut next = argmax(&tier.logits);
    let t0 = Instant::now();
    for _ in 0..n_decode {
        tier.step(&[next]);
        next = argmax(&tier.logits);
    }
    let decode = t0.elapsed().as_secs_f64();
    // Layers alone: the same shapes without embedding and logits.
    let mut h = vec![0.01f32; prompt.len() * e];
    let pos: Vec<u32> = (0..prompt.len() as u32).collect();
    tier.layers.truncate(0);
    let t0 = Instant::now();
    tier.layers.forward(&mut h, &pos).expect("forward");
    let prefill_layers = t0.elapsed().as_secs_f64();
    let mut one = vec![0.01f32; e];
    let t0 = Instant::now();
    for i in 0..n_decode {
        tier.layers.forward(&mut one, &[(prompt.len() + i) as u32]).expect("forward");
        one.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
    }
    let decode_layers = t0.elapsed().as_secs_f64();
    let (n, d) = (prompt.len() as f64, n_decode as f64);
    (Speed { prefill: n / prefill, decode: d / decode }, Speed { prefill: n / prefill_layers, decode: d / decode_layers })
}

/// GPU milliseconds per kind of dispatch.
type Profile = Vec<(&'static str, f64)>;

/// The profiles of a prefill of `prompt` and of one decode step after it, and the prefill and
/// the decode step timed as a whole (medians of 5 prefills and 16 steps).
fn profile(tier: &mut Tier<'_>, prompt: &[u32]) -> Option<(Profile, Profile, Profile, Profile)> {
    let e = tier.model.config.n_embd;
    let pos: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut h = vec![0.01f32; prompt.len() * e];
    // the prefill as a whole: medians of 5
    let mut spans: Vec<Profile> = Vec::new();
    for _ in 0..5 {
        tier.layers.truncate(0);
        h.fill(0.01);
        spans.push(tier.layers.forward_timed(&mut h, &pos).expect("timed")?);
    }
    let pre_whole = medians(&spans);
    tier.layers.truncate(0);
    h.fill(0.01);
    let pre = tier.layers.forward_profiled(&mut h, &pos).expect("profile")?;
    let mut one = vec![0.01f32; e];
    let dec = tier.layers.forward_profiled(&mut one, &[prompt.len() as u32]).expect("profile")?;
    // the decode step as a whole: medians of 16 steps
    let mut spans: Vec<Profile> = Vec::new();
    for i in 0..16 {
        spans.push(tier.layers.forward_timed(&mut one, &[(prompt.len() + 1 + i) as u32]).expect("timed")?);
        one.iter_mut().for_each(|v| *v = v.clamp(-1.0, 1.0));
    }
    Some((pre, dec, pre_whole, medians(&spans)))
}

/// Entry by entry, the median over `spans` (each with the same entries).
fn medians(spans: &[Profile]) -> Profile {
    (0..spans[0].len())
        .map(|k| {
            let mut v: Vec<f64> = spans.iter().map(|s| s[k].1).collect();
            v.sort_by(f64::total_cmp);
            (spans[0][k].0, v[v.len() / 2])
        })
        .collect()
}

#[test]
#[ignore]
fn wgpu_speed() {
    let Some(ctx) = context() else { return };
    let paths: Vec<String> = match std::env::var("FORGE_SPEED_MODELS") {
        Ok(s) => s.split(',').map(str::to_string).collect(),
        Err(_) => vec![common::smollm2_path().display().to_string()],
    };
    let n_prompt: usize = std::env::var("FORGE_SPEED_PROMPT").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let n_decode: usize = std::env::var("FORGE_SPEED_DECODE").ok().and_then(|v| v.parse().ok()).unwrap_or(64);
    let cpu = Arc::new(CpuBackend::new(0).expect("pool"));
    let mut profiles = Vec::new();
    println!("{:?}, {} matmul lanes, decode: {}", ctx.adapter(), ctx.matmul_lanes(), ctx.decode_kernels());
    println!("best of 2 (CPU) / 3 (wgpu) runs; prompt of {n_prompt} tokens in one call, then {n_decode} greedy decode steps");
    println!();
    println!("| model | backend | prefill tok/s | decode tok/s |");
    println!("|---|---|---|---|");
    for path in paths {
        let model = Model::load(&path, cpu.clone()).expect("load model");
        let name = std::path::Path::new(&path).file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or(path.clone());
        let prompt: Vec<u32> = (0..n_prompt).map(|i| ((i * 7919 + 13) % (model.config.vocab_size - 1)) as u32).collect();
        let c = Speed::best(cpu_speed(&model, &prompt, n_decode), cpu_speed(&model, &prompt, n_decode));
        let mut tier = Tier::new(ctx.clone(), &model, n_prompt, n_prompt + n_decode.max(24) + 1);
        let _ = wgpu_speed_of(&mut tier, &prompt, 8); // warm-up: clocks, first use of every buffer
        let (mut full, mut layers) = wgpu_speed_of(&mut tier, &prompt, n_decode);
        for _ in 0..2 {
            let (f, l) = wgpu_speed_of(&mut tier, &prompt, n_decode);
            (full, layers) = (Speed::best(full, f), Speed::best(layers, l));
        }
        println!("| {name} | {} | {:.1} | {:.1} |", cpu.name(), c.prefill, c.decode);
        println!("| {name} | wgpu: CPU embedding + all layers on the GPU + CPU logits | {:.1} | {:.1} |", full.prefill, full.decode);
        println!("| {name} | wgpu layers alone | {:.1} | {:.1} |", layers.prefill, layers.decode);
        println!("| {name} | wgpu tier / CPU | {:.1}x | {:.1}x |", full.prefill / c.prefill, full.decode / c.decode);
        profiles.extend(profile(&mut tier, &prompt).map(|p| (name.clone(), p)));
    }
    for (name, (pre, dec, pre_whole, whole)) in profiles {
        println!();
        println!("GPU time per kind of dispatch, {name} (one compute pass per dispatch, timestamps):");
        println!();
        // One table per step: a one-token step runs other (folded) dispatches than a batch.
        for (what, prof) in [(format!("prefill {n_prompt} tokens"), &pre), ("decode 1 token".to_string(), &dec)] {
            println!("| dispatch | {what}, ms |");
            println!("|---|---|");
            for (k, ms) in prof.iter() {
                println!("| {k} | {ms:.3} |");
            }
            println!("| total | {:.3} |", prof.iter().map(|p| p.1).sum::<f64>());
            println!();
        }
        for (what, prof) in [(format!("prefill of {n_prompt} tokens as a whole, median of 5"), &pre_whole), ("decode step as a whole (recorded as it goes), median of 16 steps".to_string(), &whole)] {
            println!("| {what} | ms |");
            println!("|---|---|");
            for (k, ms) in prof.iter() {
                println!("| {k} | {ms:.3} |");
            }
            println!();
        }
    }
}
