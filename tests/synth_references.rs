//! Every architecture against llama.cpp, on small synthetic models (`forge-cache synth-model
//! --arch`), each in the weight types `scripts/synth-references.sh` lists (every type the
//! engine reads is among them): the model is regenerated from its seed (same sha256 as the
//! file llama.cpp ran), then our prompt token ids must equal llama.cpp's, and, fed llama.cpp's
//! greedy continuation (teacher forcing), our argmax must be llama.cpp's token at every step
//! where its top-2 margin is at least 0.3 (see tests/reference_smollm2.rs for why 0.3).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::Model;
use forge_cache::gguf::synth::{parse_quant, write_synth_model, SynthArch, SynthShape};
use sha2::{Digest, Sha256};

const MARGIN: f64 = 0.3;

fn references() -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/synth_references.jsonl");
    std::fs::read_to_string(&path)
        .expect("tests/data/synth_references.jsonl (scripts/synth-references.sh writes it)")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

#[test]
fn every_architecture_and_type_matches_llama_cpp() {
    let mut by_model: BTreeMap<(String, String, u64), Vec<serde_json::Value>> = BTreeMap::new();
    for r in references() {
        let key = (r["arch"].as_str().expect("arch").to_string(), r["quant"].as_str().expect("quant").to_string(), r["seed"].as_u64().expect("seed"));
        by_model.entry(key).or_default().push(r);
    }
    let archs: std::collections::BTreeSet<&str> = by_model.keys().map(|k| k.0.as_str()).collect();
    assert_eq!(archs.into_iter().collect::<Vec<_>>(), ["gemma3", "llama3", "phi3", "qwen2", "qwen3"]);
    let backend = Arc::new(CpuBackend::new(0).expect("pool"));
    let dir = tempfile::tempdir().expect("tempdir");
    let mut summary = Vec::new();
    for ((arch, quant, seed), recs) in &by_model {
        let path = dir.path().join(format!("{arch}-{quant}-{seed}.gguf"));
        let shape = SynthShape::small(SynthArch::parse(arch).expect("arch"));
        write_synth_model(&shape, parse_quant(quant).expect("quant"), *seed, None, &path, |_| {}).expect("write");
        let sha: String = Sha256::digest(std::fs::read(&path).expect("read")).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha, recs[0]["sha256"].as_str().expect("sha256"), "{arch} {quant} seed {seed}: the generator no longer writes the file llama.cpp ran (re-run scripts/synth-references.sh)");
        let model = Model::load(&path, backend.clone()).expect("load");
        let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
        let mut state = model.new_state(64);
        let (mut checked, mut steps) = (0, 0);
        for rec in recs {
            let prompt = common::ids(&rec["prompt_tokens"]);
            let raw = rec["raw_prompt"].as_str().expect("raw_prompt");
            assert_eq!(tok.encode_prompt(raw).expect("encode"), prompt, "{}: prompt token ids", rec["id"]);
            let (c, s) = common::teacher_forced(&model, &mut state, rec, &prompt, MARGIN, rec["id"].as_str().unwrap_or(""));
            checked += c;
            steps += c + s;
        }
        // A test that can fail: most steps are confident enough to compare.
        assert!(checked * 4 >= steps, "{arch} {quant}: only {checked} of {steps} steps confident");
        summary.push(format!("{arch} {quant}: {checked}/{steps}"));
    }
    eprintln!("confident steps matched: {}", summary.join(", "));
}
