//! The decode loop allocates nothing: after warm-up, forward passes of one token plus sampling
//! make zero heap allocations (counted by a global allocator wrapper, on every thread).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use forge_cache::engine::sampler::{Sampler, SamplingParams};
use forge_cache::engine::{Logits, SeqBatch};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn decode_steps_do_not_allocate() {
    let model = common::fast_model();
    let mut state = model.new_state(64);
    let prompt = common::ids(&common::jsonl("smollm2_greedy.jsonl")[0]["prompt_tokens"]);
    let mut kv = model.new_kv(prompt.len() + 64);
    let mut samplers = [
        Sampler::new(SamplingParams::greedy(), model.config.vocab_size).expect("greedy"),
        Sampler::new(SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: Some(1) }, model.config.vocab_size)
            .expect("sampled"),
    ];
    model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &prompt, logits: Logits::Last }]).expect("prefill");
    let mut next = [0u32; 1];
    let mut step = |state: &mut _, kv: &mut _, s: &mut Sampler| {
        next[0] = s.sample(model.logits(state, 0));
        model.forward(state, &mut [SeqBatch { kv, tokens: &next, logits: Logits::Last }]).expect("decode");
    };
    for s in samplers.iter_mut() {
        step(&mut state, &mut kv, s); // warm-up: scratch buffers reach their size
    }
    let before = ALLOCS.load(Ordering::Relaxed);
    for i in 0..40 {
        step(&mut state, &mut kv, &mut samplers[i % 2]);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(allocs, 0, "40 decode steps made {allocs} heap allocations");
    // The counter does see allocations (so the assertion above can fail).
    let v = std::hint::black_box(vec![1u8; 64]);
    assert!(ALLOCS.load(Ordering::Relaxed) > before + allocs && v.len() == 64);
}
