mod common;
use forge_cache::engine::{Logits, SeqBatch};
#[test]
fn diag() {
    let model = common::fast_model();
    let mut state = model.new_state(256);
    let mut devs = vec![];
    for rec in common::jsonl("smollm2_greedy.jsonl") {
        let prompt = common::ids(&rec["prompt_tokens"]);
        let greedy = common::ids(&rec["greedy_tokens"]);
        let margins: Vec<f64> = rec["top2_margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let seq: Vec<u32> = prompt.iter().chain(&greedy).copied().collect();
        let mut kv = model.new_kv(seq.len());
        model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &seq, logits: Logits::All }]).unwrap();
        for (step, want) in greedy.iter().enumerate() {
            let l = model.logits(&state, prompt.len() - 1 + step);
            let w = l[*want as usize];
            let best_other = l.iter().enumerate().filter(|(i, _)| *i != *want as usize).map(|(_, v)| *v).fold(f32::MIN, f32::max);
            let ours = (w - best_other) as f64;
            devs.push((ours - margins[step]).abs());
            if margins[step] >= 0.1 && ours < 0.05 { eprintln!("{} step {step}: ref {} ours {ours:.3}", rec["id"], margins[step]); }
        }
    }
    devs.sort_by(|a,b| a.partial_cmp(b).unwrap());
    let n = devs.len();
    eprintln!("margin |dev|: median {:.4} p90 {:.4} max {:.4} (n={n})", devs[n/2], devs[n*9/10], devs[n-1]);
}
