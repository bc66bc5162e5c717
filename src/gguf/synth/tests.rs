use std::sync::Arc;

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::engine::tokenizer::Tokenizer;
use crate::engine::{Logits, Model, SeqBatch};

#[test]
fn synthetic_tokenizers_load_and_round_trip() {
    for arch in SynthArch::ALL {
        let meta: std::collections::BTreeMap<String, Value> = synthetic_tokenizer(arch, 1000).into_iter().collect();
        let tok = Tokenizer::from_metadata(&meta).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
        assert_eq!(tok.vocab_size(), 1000);
        for text in ["hello synthetic world", "The capital of France is Paris.", "naïve café 🚀 12345"] {
            let ids = tok.encode(text, false).expect("encode");
            assert!(!ids.is_empty() && ids.iter().all(|&i| (i as usize) < 1000));
            // SentencePiece with a space prefix (Phi-3's) decodes to the text after one space.
            let prefix = if arch == SynthArch::Phi3 { " " } else { "" };
            assert_eq!(tok.decode(&ids, false).expect("decode"), format!("{prefix}{text}"), "{arch:?}");
        }
        // Learned merges make ordinary words shorter than their bytes.
        let n = tok.encode("The capital of France", false).expect("encode").len();
        assert!(n < 12, "{arch:?}: {n} tokens");
    }
}

#[test]
fn engine_loads_every_synthetic_architecture_and_runs_it() {
    for arch in SynthArch::ALL {
        for quant in [SynthQuant::All(GgmlType::Q8_0), SynthQuant::Q4KM] {
            let f = tempfile::NamedTempFile::new().expect("tmp");
            let mut calls = 0;
            let rep = write_synth_model(&SynthShape::small(arch), quant, 7, None, f.path(), |p| {
                calls += 1;
                assert!(p.done <= p.total);
            })
            .expect("write");
            assert_eq!(calls, tensor_plan(&rep.shape).len());
            assert_eq!(rep.file_bytes, std::fs::metadata(f.path()).expect("meta").len());
            let model = Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            assert_eq!((model.config.n_layer, model.config.n_embd, model.config.vocab_size), (rep.shape.n_layer, 256, 1024));
            assert_eq!(model.config.head_dim, rep.shape.head_dim());
            let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
            let ids = tok.encode_prompt("the cat sat on the mat").expect("encode");
            let mut state = model.new_state(32);
            let mut kv = model.new_kv(32);
            model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &ids, logits: Logits::All }]).expect("forward");
            for i in 0..ids.len() {
                let l = model.logits(&state, i);
                assert!(l.iter().all(|v| v.is_finite()) && l.iter().any(|&v| v != 0.0), "{arch:?} {quant:?}: logits of token {i}");
            }
        }
    }
}

#[test]
fn same_seed_same_bytes() {
    let (a, b) = (tempfile::NamedTempFile::new().expect("tmp"), tempfile::NamedTempFile::new().expect("tmp"));
    let shape = SynthShape::small(SynthArch::Gemma3);
    write_synth_model(&shape, SynthQuant::Q4KM, 3, None, a.path(), |_| {}).expect("write");
    write_synth_model(&shape, SynthQuant::Q4KM, 3, None, b.path(), |_| {}).expect("write");
    assert_eq!(std::fs::read(a.path()).expect("read"), std::fs::read(b.path()).expect("read"));
    write_synth_model(&shape, SynthQuant::Q4KM, 4, None, b.path(), |_| {}).expect("write");
    assert_ne!(std::fs::read(a.path()).expect("read"), std::fs::read(b.path()).expect("read"));
}

#[test]
fn llama3_rope_factors_follow_the_converter() {
    let f = llama3_rope_factors(128, 500000.0);
    assert_eq!(f.len(), 64);
    assert_eq!(f[0], 1.0); // high frequency: unchanged
    assert_eq!(f[63], 8.0); // wavelength beyond the original context: the full factor
    assert!(f.windows(2).all(|w| w[0] <= w[1]), "factors grow with wavelength");
    assert!(f.iter().any(|&x| x > 1.0 && x < 8.0), "a smooth band in between");
}

#[test]
fn presets_and_errors() {
    let t = SynthShape::preset("tinyllama-1.1b").expect("preset");
    assert_eq!((t.n_embd, t.n_layer, t.n_head, t.n_head_kv, t.n_ff, t.vocab, t.context), (2048, 22, 32, 4, 5632, 32000, 2048));
    assert!((1_000_000_000..1_200_000_000).contains(&t.n_params()), "{}", t.n_params());
    assert!(SynthShape::preset("smollm2-135m").is_some() && SynthShape::preset("gpt-5").is_none());
    assert!(parse_quant("Q4_0").is_ok() && parse_quant("q5_k").is_ok() && parse_quant("q4_k_m").is_ok() && parse_quant("q7_k").is_err());
    assert!(SynthArch::parse("gemma3").is_ok() && matches!(SynthArch::parse("gpt5"), Err(SynthError::UnknownArch(_))));
    let mut bad = tiny_shape();
    bad.n_head = 3;
    let f = tempfile::NamedTempFile::new().expect("tmp");
    assert!(matches!(write_synth_model(&bad, GgmlType::Q4_0, 1, None, f.path(), |_| {}), Err(SynthError::BadShape(_))));
}

/// The service maps a model at start-up and its engine thread makes the CPU's copies before its
/// first step (`Model::load_unprepared`, `Model::prepare_weights`): the copies are the ones
/// `Model::load` makes, a second call makes none, and the logits are bitwise those of a model
/// loaded and prepared at once.
#[test]
fn weights_prepared_later_are_the_ones_made_at_load() {
    let f = tempfile::NamedTempFile::new().expect("tmp");
    write_synth_model(&SynthShape::small(SynthArch::Llama), SynthQuant::All(GgmlType::Q4_0), 5, None, f.path(), |_| {}).expect("write");
    let cpu = || Arc::new(CpuBackend::new(1).expect("pool"));
    let eager = Model::load(f.path(), cpu()).expect("load");
    let lazy = Model::load_unprepared(f.path(), cpu()).expect("load");
    let copies = |m: &Model| {
        let mut v: Vec<bool> = m.weights.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]).map(|w| w.prepared.get().is_some()).collect();
        v.push(m.weights.output.prepared.get().is_some());
        v
    };
    assert!(copies(&lazy).iter().all(|&c| !c), "nothing is repacked before prepare_weights");
    let bytes = lazy.prepare_weights();
    assert_eq!(copies(&lazy), copies(&eager));
    if cpu().simd() == crate::backend::cpu::SimdLevel::Avx512Vnni {
        assert!(bytes > 0 && copies(&lazy).iter().all(|&c| c), "the AVX-512 level repacks every Q4_0 matrix");
    }
    assert_eq!(lazy.prepare_weights(), 0, "a matrix keeps the copy it got first");
    let tok = Tokenizer::from_gguf(&eager.gguf).expect("tokenizer");
    let ids = tok.encode_prompt("the cat sat on the mat").expect("encode");
    let run = |m: &Model| {
        let (mut state, mut kv) = (m.new_state(32), m.new_kv(32));
        m.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &ids, logits: Logits::Last }]).expect("forward");
        m.logits(&state, 0).iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    assert_eq!(run(&lazy), run(&eager));
}
