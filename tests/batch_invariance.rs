//! Batch invariance, a product guarantee: a token's logits and KV are bitwise identical whether
//! it is computed alone in decode, inside a prefill batch (any chunking), next to another
//! sequence in the same forward call, or after its prefix KV was computed elsewhere and reused.
//! Run on every CPU kernel level this machine has (scalar reference, then SIMD) for SmolLM2,
//! Gemma 3 270M and a small synthetic model of every architecture (Gemma's with a sliding window
//! of 8, so windows cross chunk edges), and on the wgpu tier for SmolLM2: every layer on the GPU,
//! and a split with layers on both (software adapters allowed, so this runs on lavapipe in CI;
//! skipped with a message when there is no adapter), and on the HIP tier for SmolLM2: every
//! layer, a CPU/HIP split and a CPU/wgpu/HIP split (skipped without a HIP device).

mod common;

use std::sync::Arc;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::backend::wgpu::{WgpuContext, WgpuOptions};
use forge_cache::backend::Backend;
use forge_cache::engine::placement::{place, BackendChoice, PlacementOptions};
use forge_cache::engine::{KvCache, Logits, Model, SeqBatch};

/// A digest of a logits row's bits (FNV-1a): equal rows, equal digests; a 262k-entry vocabulary
/// times every position would not fit in memory as bits.
fn bits(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3))
}

/// Logits of every position, feeding `tokens` in chunks of the given sizes (cycled).
fn logits_in_chunks(model: &Model, tokens: &[u32], chunks: &[usize]) -> (Vec<u64>, KvCache) {
    let mut state = model.new_state(64);
    let mut kv = model.new_kv(tokens.len());
    let mut out = Vec::new();
    let mut at = 0;
    for &c in chunks.iter().cycle() {
        if at >= tokens.len() {
            break;
        }
        let end = (at + c).min(tokens.len());
        model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &tokens[at..end], logits: Logits::All }]).expect("forward");
        for i in 0..end - at {
            out.push(bits(model.logits(&state, i)));
        }
        at = end;
    }
    (out, kv)
}

fn check_backend(backend: Arc<dyn Backend>, n: usize) {
    let model = Model::load(common::smollm2_path(), backend).expect("load");
    check_model(&model, n);
}

/// The first `n` tokens of the SmolLM2 SQuAD record (prompt + greedy continuation).
fn smollm2_tokens(n: usize) -> (Vec<u32>, Vec<u32>) {
    let rec = &common::jsonl("smollm2_greedy.jsonl")[13]; // the ~200-token SQuAD context
    let mut seq = common::ids(&rec["prompt_tokens"]);
    seq.extend(common::ids(&rec["greedy_tokens"]));
    seq.truncate(n);
    (seq, common::ids(&common::jsonl("smollm2_greedy.jsonl")[4]["prompt_tokens"]))
}

fn check_model(model: &Model, n: usize) {
    let (seq, other) = smollm2_tokens(n);
    check_tokens(model, &seq, &other);
}

/// The guarantee for `seq` on `model`, with `other` as the neighbour in continuous batching.
fn check_tokens(model: &Model, seq: &[u32], other: &[u32]) {
    let name = format!("{} {}", model.config.arch, model.placement());

    // One prefill batch (the reference for this backend) vs pure decode vs odd chunkings.
    let (batch, kv_batch) = logits_in_chunks(model, seq, &[64]);
    for chunks in [&[1usize][..], &[7, 3, 11], &[2, 31]] {
        let (other, kv) = logits_in_chunks(model, seq, chunks);
        for (pos, (a, b)) in batch.iter().zip(&other).enumerate() {
            assert!(a == b, "{name}: logits at position {pos} differ between one batch and chunks {chunks:?}");
        }
        assert!(kv.k[..] == kv_batch.k[..] && kv.v[..] == kv_batch.v[..], "{name}: KV differs for chunks {chunks:?}");
    }

    // Continuous batching: our sequence shares forward calls with another one.
    let mut state = model.new_state(128);
    let mut kv_a = model.new_kv(seq.len());
    let mut kv_b = model.new_kv(other.len() + seq.len());
    model.forward(&mut state, &mut [SeqBatch { kv: &mut kv_b, tokens: other, logits: Logits::None }]).expect("warm b");
    let half = seq.len() / 2;
    model
        .forward(
            &mut state,
            &mut [
                SeqBatch { kv: &mut kv_b, tokens: &seq[..5], logits: Logits::Last },
                SeqBatch { kv: &mut kv_a, tokens: &seq[..half], logits: Logits::All },
            ],
        )
        .expect("mixed batch");
    for i in 0..half {
        assert!(bits(model.logits(&state, 1 + i)) == batch[i], "{name}: position {i} differs in a continuous batch");
    }

    // KV reuse: copy the prefix KV into a fresh cache (as the workload builder will), run the rest.
    let mut restored = model.new_kv(seq.len() + 8);
    restored.copy_prefix_from(&kv_a, half).expect("copy prefix");
    let mut state = model.new_state(64.max(seq.len() - half));
    model.forward(&mut state, &mut [SeqBatch { kv: &mut restored, tokens: &seq[half..], logits: Logits::All }]).expect("suffix");
    for i in half..seq.len() {
        assert!(bits(model.logits(&state, i - half)) == batch[i], "{name}: position {i} differs after prefix reuse");
    }
    eprintln!("{name}: {} positions bitwise identical across decode, chunked prefill, continuous batching and prefix reuse", seq.len());
}

#[test]
fn logits_and_kv_are_bitwise_batch_invariant_on_every_cpu_level() {
    for (i, b) in common::cpu_backends(2).into_iter().enumerate() {
        // The scalar reference is slow: a shorter sequence keeps the test quick.
        check_backend(b, if i == 0 { 48 } else { 120 });
    }
}

#[test]
fn gemma3_is_bitwise_batch_invariant_on_every_cpu_level() {
    let g = forge_cache::gguf::GgufFile::open(common::gemma3_path()).expect("open");
    let tok = forge_cache::engine::tokenizer::Tokenizer::from_gguf(&g).expect("tokenizer");
    let text = std::fs::read_to_string(common::reference("smollm2_perplexity_text.txt")).expect("text");
    let tokens = tok.encode_prompt(&text[..4000]).expect("encode");
    let other = tok.encode_prompt("<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n").expect("encode");
    for (i, b) in common::cpu_backends(2).into_iter().enumerate() {
        let model = Model::load(common::gemma3_path(), b).expect("load Gemma 3");
        // The scalar reference is slow: a shorter sequence keeps the test quick.
        check_tokens(&model, &tokens[..if i == 0 { 24 } else { 96 }], &other);
    }
}

/// Every architecture's layer (biases, q/k norms, post-norms, GeGLU, NeoX RoPE, fused matrices,
/// a sliding window of 8 crossing every chunk edge) on small synthetic models, every CPU level.
#[test]
fn every_architecture_is_bitwise_batch_invariant_on_every_cpu_level() {
    use forge_cache::gguf::synth::{write_synth_model, SynthArch, SynthQuant, SynthShape};
    let dir = tempfile::tempdir().expect("tempdir");
    for arch in SynthArch::ALL {
        let path = dir.path().join(format!("{}.gguf", arch.name()));
        write_synth_model(&SynthShape::small(arch), SynthQuant::Q4KM, 5, None, &path, |_| {}).expect("write");
        let seq: Vec<u32> = (0..70u32).map(|i| (i * 37 + 11) % 1000).collect();
        let other: Vec<u32> = (0..9u32).map(|i| (i * 101 + 3) % 1000).collect();
        for b in common::cpu_backends(2) {
            check_tokens(&Model::load(&path, b).expect("load"), &seq, &other);
        }
    }
}

#[test]
fn logits_are_bitwise_batch_invariant_on_wgpu_and_split() {
    match WgpuContext::new(WgpuOptions { allow_software: true, ..WgpuOptions::default() }) {
        Err(e) if e.is_unavailable() => return eprintln!("skipped: {e}"),
        Err(e) => panic!("wgpu context: {e}"),
        Ok(_) => {}
    }
    for (backend, split) in [(BackendChoice::Wgpu, None), (BackendChoice::Split, Some("cpu:13,igpu:17"))] {
        let mut model = Model::load(common::smollm2_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load");
        let opts = PlacementOptions { backend, split: split.map(|s| s.parse().expect("split")), allow_software: true };
        place(&mut model, &opts).expect("place");
        // lavapipe is slow: a short sequence still crosses chunk and attention-tile edges.
        check_model(&model, 40);
    }
}

#[test]
fn logits_are_bitwise_batch_invariant_on_hip_and_splits() {
    if let Err(e) = forge_cache::backend::hip::HipContext::get() {
        assert!(e.is_unavailable(), "{e}");
        assert!(std::env::var_os("FORGE_HIP_REQUIRED").is_none(), "FORGE_HIP_REQUIRED is set and there is no HIP device: {e}");
        return eprintln!("skipped: no HIP device ({e})");
    }
    let wgpu = WgpuContext::new(WgpuOptions { allow_software: true, ..WgpuOptions::default() }).is_ok();
    let mut placements = vec![(BackendChoice::Hip, None), (BackendChoice::Split, Some("cpu:13,dgpu:17"))];
    if wgpu {
        placements.push((BackendChoice::Split, Some("dgpu:10,igpu:10,cpu:10")));
    }
    for (backend, split) in placements {
        let mut model = Model::load(common::smollm2_path(), Arc::new(CpuBackend::new(0).expect("pool"))).expect("load");
        let opts = PlacementOptions { backend, split: split.map(|s| s.parse().expect("split")), allow_software: true };
        place(&mut model, &opts).expect("place");
        check_model(&model, 160);
    }
}
