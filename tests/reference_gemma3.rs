//! Gemma 3 270M (Q4_K / Q6_K / Q5_0 / Q8_0 weights, SentencePiece vocabulary, sliding-window
//! layers) against llama.cpp's reference outputs (../shared/reference/gemma3_*): prompt token
//! ids, teacher-forced argmax at every step with margin >= 0.3, free greedy decoding over the
//! confident prefix (`safe_prefix_len`), and perplexity within 1%.
//!
//! The reference was made by `llref`, whose JSON reader decodes `\uXXXX` escapes one by one, so
//! a character outside the BMP (the 🚀 of `plain-3`) reached llama.cpp as two UTF-16
//! surrogates, each written as a three-byte sequence (CESU-8): not UTF-8, and tokenized as
//! byte tokens. [`llref_bytes`] gives the tokenizer exactly those bytes.

mod common;

use forge_cache::engine::eval::perplexity;
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::tokenizer::Tokenizer;

/// Steps where llama.cpp's top-2 margin is below this are near-ties (see reference_smollm2.rs).
const MARGIN: f64 = 0.3;

/// The bytes llref passed to llama.cpp for `text`: UTF-8, except that a character beyond
/// U+FFFF becomes its two surrogates, each encoded as if it were a character (CESU-8).
fn llref_bytes(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        let cp = c as u32;
        if cp < 0x10000 {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            continue;
        }
        let v = cp - 0x10000;
        for s in [0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF)] {
            out.extend_from_slice(&[0xE0 | (s >> 12) as u8, 0x80 | ((s >> 6) & 0x3F) as u8, 0x80 | (s & 0x3F) as u8]);
        }
    }
    out
}

/// Our prompt ids for a reference record: BOS, then the raw prompt's bytes as llref sent them.
fn prompt_ids(tok: &Tokenizer, rec: &serde_json::Value) -> Vec<u32> {
    let raw = rec["raw_prompt"].as_str().expect("raw_prompt");
    let mut ids = vec![tok.bos_id().expect("Gemma has a BOS token")];
    ids.extend(tok.encode_bytes(&llref_bytes(raw), true).expect("encode"));
    ids
}

#[test]
fn prompt_token_ids_equal_llama_cpp() {
    let g = forge_cache::gguf::GgufFile::open(common::gemma3_path()).expect("open");
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    assert_eq!((tok.model_name(), tok.bos_id(), tok.add_bos()), ("llama", Some(2), true));
    let recs = common::jsonl("gemma3_greedy.jsonl");
    for rec in &recs {
        assert_eq!(prompt_ids(&tok, rec), common::ids(&rec["prompt_tokens"]), "{}", rec["id"]);
        // Valid UTF-8 prompts: the ordinary entry point gives the same ids.
        let raw = rec["raw_prompt"].as_str().expect("raw_prompt");
        if raw.chars().all(|c| (c as u32) < 0x10000) {
            assert_eq!(tok.encode_prompt(raw).expect("encode"), common::ids(&rec["prompt_tokens"]), "{}", rec["id"]);
        }
    }
    // And the 🚀 itself, sent as UTF-8, is one token of the vocabulary.
    assert_eq!(tok.encode("🚀", false).expect("encode"), vec![tok.token_id("🚀").expect("in the vocabulary")]);
}

#[test]
fn teacher_forced_argmax_matches_llama_cpp_where_confident() {
    let model = common::gemma3_model();
    let mut state = model.new_state(128);
    let (mut checked, mut skipped) = (0, 0);
    for rec in common::jsonl("gemma3_greedy.jsonl") {
        let (c, s) = common::teacher_forced(&model, &mut state, &rec, &common::ids(&rec["prompt_tokens"]), MARGIN, &rec["id"].to_string());
        checked += c;
        skipped += s;
    }
    eprintln!("teacher forcing: {checked} confident steps matched, {skipped} near-ties skipped");
    assert!(checked > 500, "{checked}");
}

#[test]
fn free_greedy_decoding_reproduces_the_confident_prefix() {
    let model = common::gemma3_model();
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let mut state = model.new_state(64);
    let mut total = 0;
    for rec in common::jsonl("gemma3_greedy.jsonl") {
        let greedy = common::ids(&rec["greedy_tokens"]);
        let safe = rec["safe_prefix_len"].as_u64().expect("safe_prefix_len") as usize;
        let prompt = prompt_ids(&tok, &rec);
        let params = GenerateParams { max_tokens: greedy.len(), sampling: SamplingParams::greedy(), stop_ids: tok.stop_ids().to_vec() };
        let out = generate(&model, &mut state, &prompt, &params, |_| std::ops::ControlFlow::Continue(())).expect("generate");
        let ours: Vec<u32> = out.tokens.iter().copied().chain(out.stop_token).collect();
        assert!(ours.len() >= safe, "{}: stopped after {} tokens, llama.cpp was confident for {safe}", rec["id"], ours.len());
        assert_eq!(&ours[..safe], &greedy[..safe], "{}: free decoding diverges inside the confident prefix", rec["id"]);
        total += safe;
        eprintln!("{:>8}: {safe:2} confident tokens match; text {:?}", rec["id"].as_str().unwrap_or(""), tok.decode(&out.tokens, true).unwrap_or_default());
    }
    eprintln!("free decoding: {total} confident tokens reproduced");
}

#[test]
fn perplexity_within_one_percent_of_llama_cpp() {
    let model = common::gemma3_model();
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(common::reference("gemma3_perplexity.json")).expect("read")).expect("json");
    let text = std::fs::read_to_string(common::reference(v["text_file"].as_str().expect("text_file"))).expect("text");
    // llama.cpp: the whole text tokenized once with BOS; each chunk then starts with BOS.
    let tokens = tok.encode_prompt(&text).expect("encode");
    let n_ctx = v["n_ctx"].as_u64().expect("n_ctx") as usize;
    let want = v["llamacpp_ppl"].as_f64().expect("ppl");
    let mut state = model.new_state(128);
    let p = perplexity(&model, &mut state, &tokens, n_ctx, tok.bos_id(), |d, n| eprintln!("perplexity chunk {d}/{n}")).expect("ppl");
    eprintln!("perplexity {:.4} over {} tokens ({} chunks); llama.cpp {want}", p.ppl, p.scored_tokens, p.n_chunks);
    assert_eq!(p.n_chunks, v["n_chunks"].as_u64().expect("n") as usize);
    assert!((p.ppl - want).abs() / want < 0.01, "perplexity {} vs llama.cpp {want}", p.ppl);
}
