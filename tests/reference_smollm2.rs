//! SmolLM2-135M against llama.cpp's reference outputs (../shared/reference, see its README):
//! teacher-forced argmax at every confident step, and perplexity within 1%.
//! Free decoding from the raw prompt (which needs the tokenizer) is in tests/generate_reference.rs.

mod common;

use forge_cache::engine::eval::perplexity;
use forge_cache::engine::sampler::argmax;
use forge_cache::engine::{Logits, SeqBatch};

#[test]
fn teacher_forced_argmax_matches_llama_cpp_where_confident() {
    let model = common::fast_model();
    let mut state = model.new_state(256);
    let (mut checked, mut skipped) = (0, 0);
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        let prompt = common::ids(&rec["prompt_tokens"]);
        let greedy = common::ids(&rec["greedy_tokens"]);
        let margins: Vec<f64> = rec["top2_margins"].as_array().expect("margins").iter().map(|m| m.as_f64().expect("f64")).collect();
        let seq: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let mut kv = model.new_kv(seq.len());
        model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &seq, logits: Logits::All }]).expect("forward");
        for (step, want) in greedy.iter().enumerate() {
            if margins[step] < 0.1 {
                skipped += 1;
                continue;
            }
            let got = argmax(model.logits(&state, prompt.len() - 1 + step));
            assert_eq!(got, *want, "{}: step {step} (margin {}) argmax {got}, llama.cpp {want}", rec["id"], margins[step]);
            checked += 1;
        }
    }
    eprintln!("teacher forcing: {checked} confident steps matched, {skipped} near-ties skipped");
    assert!(checked > 300);
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
    let p = perplexity(&model, &mut state, &tokens, n_ctx, |d, n| eprintln!("perplexity chunk {d}/{n}")).expect("ppl");
    eprintln!("perplexity {:.4} over {} tokens ({} chunks); llama.cpp {want}", p.ppl, p.scored_tokens, p.n_chunks);
    assert_eq!(p.n_chunks, v["n_chunks"].as_u64().expect("n") as usize);
    assert!((p.ppl - want).abs() / want < 0.01, "perplexity {} vs llama.cpp {want}", p.ppl);
}
