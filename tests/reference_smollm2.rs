//! SmolLM2-135M against llama.cpp's reference outputs (../shared/reference, see its README):
//! teacher-forced argmax at every confident step, free greedy decoding over the confident prefix,
//! and perplexity within 1%.
//!
//! "Confident" means llama.cpp's top-1 minus top-2 logit is at least [`MARGIN`] = 0.3, not the
//! 0.1 the reference README suggests: llama.cpp's own logits carry rounding noise from 8-bit
//! activations and f16 attention (median 0.1, max 1.3 logits against float64 arithmetic on the
//! same weights), and exact float64 math picks a different token than llama.cpp at 7 steps
//! whose llama.cpp margin is 0.10-0.24. `scripts/reference-noise.py` re-measures this; 0.3 is
//! the smallest threshold at which float64 truth itself passes.

mod common;

use forge_cache::engine::eval::perplexity;
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::tokenizer::Tokenizer;

/// Steps where llama.cpp's top-2 margin is below this are near-ties (see the module doc).
const MARGIN: f64 = 0.3;

#[test]
fn teacher_forced_argmax_matches_llama_cpp_where_confident() {
    let model = common::fast_model();
    let mut state = model.new_state(256);
    let (mut checked, mut skipped) = (0, 0);
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        let (c, s) = common::teacher_forced(&model, &mut state, &rec, &common::ids(&rec["prompt_tokens"]), MARGIN, &rec["id"].to_string());
        checked += c;
        skipped += s;
    }
    eprintln!("teacher forcing: {checked} confident steps matched, {skipped} near-ties skipped");
    assert!(checked > 300);
}

#[test]
fn free_greedy_decoding_reproduces_the_confident_prefix() {
    let model = common::fast_model();
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let mut state = model.new_state(256);
    let mut total = 0;
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        let greedy = common::ids(&rec["greedy_tokens"]);
        let margins = common::margins(&rec);
        let confident = margins.iter().position(|&m| m < MARGIN).unwrap_or(greedy.len());
        let prompt = tok.encode(rec["raw_prompt"].as_str().expect("raw_prompt"), true).expect("encode");
        assert_eq!(prompt, common::ids(&rec["prompt_tokens"]), "{}: prompt tokens", rec["id"]);
        let params = GenerateParams {
            max_tokens: rec["max_new_tokens"].as_u64().unwrap_or(64) as usize,
            sampling: SamplingParams::greedy(),
            stop_ids: tok.stop_ids().to_vec(),
        };
        let out = generate(&model, &mut state, &prompt, &params, |_| std::ops::ControlFlow::Continue(())).expect("generate");
        // llama.cpp's greedy_tokens end with the end-of-generation token when it stopped.
        let ours: Vec<u32> = out.tokens.iter().copied().chain(out.stop_token).collect();
        assert!(ours.len() >= confident, "{}: stopped after {} tokens, llama.cpp was confident for {confident}", rec["id"], ours.len());
        assert_eq!(&ours[..confident], &greedy[..confident], "{}: free decoding diverges inside the confident prefix", rec["id"]);
        total += confident;
        eprintln!("{:>12}: {confident:2} confident tokens match; text {:?}", rec["id"].as_str().unwrap_or(""), tok.decode(&out.tokens, true).unwrap_or_default());
    }
    eprintln!("free decoding: {total} confident tokens reproduced");
}

#[test]
fn perplexity_within_one_percent_of_llama_cpp() {
    let model = common::fast_model();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::reference("smollm2_perplexity.json")).expect("read")).expect("json");
    let tokens = common::ids(&v["tokens"]);
    let n_ctx = v["n_ctx"].as_u64().expect("n_ctx") as usize;
    let want = v["llamacpp_ppl"].as_f64().expect("ppl");
    let mut state = model.new_state(512);
    let p = perplexity(&model, &mut state, &tokens, n_ctx, None, |d, n| eprintln!("perplexity chunk {d}/{n}")).expect("ppl");
    eprintln!("perplexity {:.4} over {} tokens ({} chunks); llama.cpp {want}", p.ppl, p.scored_tokens, p.n_chunks);
    assert_eq!(p.n_chunks, v["n_chunks"].as_u64().expect("n") as usize);
    assert!((p.ppl - want).abs() / want < 0.01, "perplexity {} vs llama.cpp {want}", p.ppl);
}
