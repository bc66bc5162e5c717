//! BLEND in the engine, on both real models (SmolLM2: llama, adjacent-pair RoPE; Gemma 3:
//! NeoX RoPE, sliding-window layers with their own base): a span's keys computed at other
//! positions and re-rotated into place are the keys computed there (layer 0, where a key depends
//! on its token and position only), its values bit for bit; with every token recomputed a blend
//! is bit for bit a full prefill in every layer; with none recomputed the span tokens keep reused
//! KV after the check layers (and the layers before are exact).

mod common;

use std::any::Any;

use common::RealModel;
use forge_cache::engine::blend::{place, prefill, Blend, ReusedSpan, CHECK_LAYERS};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::{KvCache, Logits, Model, PrefixCache, SeqBatch};

/// A span cache that holds nothing: the engine computes the span's own KV.
#[derive(Debug)]
struct Empty;

impl PrefixCache for Empty {
    fn load(&mut self, _kv: &mut KvCache, _prompt: &[u32]) -> usize {
        0
    }
    fn publish(&mut self, _kv: &KvCache, _prompt: &[u32], _generated: &[u32]) {}
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

fn prompt(m: &Model) -> Vec<u32> {
    let tok = Tokenizer::from_gguf(&m.gguf).expect("tokenizer");
    let text = "<start_of_turn>user\nSuper Bowl 50 was an American football game to determine the champion of the National \
                Football League for the 2015 season. The Denver Broncos defeated the Carolina Panthers 24 to 10 to earn \
                their third title. The game was played on February 7, 2016, at Levi's Stadium in Santa Clara. Which team won?";
    let mut ids = tok.encode_prompt(text).expect("encode");
    ids.truncate(72);
    ids
}

fn full(m: &Model, tokens: &[u32], capacity: usize) -> KvCache {
    let mut kv = m.new_kv(capacity);
    let mut state = m.new_state(tokens.len());
    m.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens, logits: Logits::None }]).expect("forward");
    kv
}

/// (max |a - b|, max |b|) over positions `range` of one layer's keys (or values).
fn diff(a: &KvCache, b: &KvCache, layer: usize, values: bool, range: std::ops::Range<usize>) -> (f32, f32) {
    let (heads, hd) = a.head_shape();
    let (ak, av) = a.layer(layer);
    let (bk, bv) = b.layer(layer);
    let (x, y) = if values { (av, bv) } else { (ak, bk) };
    let (mut worst, mut scale) = (0f32, 0f32);
    for h in 0..heads {
        for p in range.clone() {
            for d in 0..hd {
                let (u, v) = (x[(h * a.capacity + p) * hd + d].to_f32(), y[(h * b.capacity + p) * hd + d].to_f32());
                worst = worst.max((u - v).abs());
                scale = scale.max(v.abs());
            }
        }
    }
    (worst, scale)
}

fn span(p: &[u32], at: usize, len: usize) -> ReusedSpan {
    let tokens: Vec<u32> = std::iter::once(p[0]).chain(p[at..at + len].iter().copied()).collect();
    ReusedSpan { at, tokens, base: 1, cache: Box::new(Empty) }
}

/// A span whose own sequence is the prompt up to its end (its leading context is the prompt
/// before it): an exact prefix.
fn lead_span(p: &[u32], at: usize, len: usize) -> ReusedSpan {
    ReusedSpan { at, tokens: p[..at + len].to_vec(), base: at, cache: Box::new(Empty) }
}

fn check(model: RealModel) {
    let m = model.load();
    let p = prompt(&m);
    let (at, len) = (20, 30);
    let n = p.len() - 1;

    // Re-rotation: layer 0 keys of the span computed at 1.. and moved to `at..` are the keys
    // computed at `at..` (f16 rounding of a rotation), the values the same bits.
    let s = span(&p, at, len);
    let own = full(&m, &s.tokens, s.tokens.len());
    let mut placed = m.new_kv(p.len());
    place(&m, &own, 1, at, len, &mut placed);
    let reference = full(&m, &p[..n], p.len());
    let (worst, scale) = diff(&placed, &reference, 0, false, at..at + len);
    assert!(worst <= 4e-3 * scale.max(1.0), "{model:?}: re-rotated keys off by {worst} (scale {scale})");
    assert_eq!(diff(&placed, &reference, 0, true, at..at + len).0, 0.0, "{model:?}: values are moved as they are");
    // Every token recomputed: bit for bit the full prefill, whatever was reused.
    let spans = |r: f32| Blend { spans: vec![span(&p, 5, 12), span(&p, at, len)], recompute: r, report: Default::default() };
    let mut kv = m.new_kv(p.len());
    let mut b = spans(1.0);
    assert_eq!(prefill(&m, &mut kv, &p, &mut b).expect("blend"), n);
    assert_eq!((b.report.recomputed, b.report.reused, b.report.span_computed), (42, 0, 44));
    for l in 0..m.config.n_layer {
        for values in [false, true] {
            assert_eq!(diff(&kv, &reference, l, values, 0..n).0, 0.0, "{model:?}: layer {l} differs from the full prefill");
        }
    }

    // None recomputed: exact before the check layers' end, reused KV after for span tokens only.
    let mut kv = m.new_kv(p.len());
    let mut b = spans(0.0);
    prefill(&m, &mut kv, &p, &mut b).expect("blend");
    assert_eq!((b.report.recomputed, b.report.reused, b.report.other), (0, 42, p.len() - 42));
    for l in 0..CHECK_LAYERS {
        assert_eq!(diff(&kv, &reference, l, true, 0..n).0, 0.0, "{model:?}: check layer {l} is exact");
    }
    let last = m.config.n_layer - 1;
    assert_eq!(diff(&kv, &reference, last, true, 0..5).0, 0.0, "{model:?}: tokens before the spans are exact");
    assert!(diff(&kv, &reference, last, true, at..at + len).0 > 0.0, "{model:?}: span tokens kept reused KV");

    // A first span that is the prompt's start is an exact prefix: kept, never recomputed, and
    // its positions are the full prefill's in every layer; the ratio counts the moved spans only.
    for (r, recomputed) in [(0.0, 0), (1.0, len)] {
        let mut kv = m.new_kv(p.len());
        let mut b = Blend { spans: vec![lead_span(&p, 5, 12), span(&p, at, len)], recompute: r, report: Default::default() };
        prefill(&m, &mut kv, &p, &mut b).expect("blend");
        assert_eq!((b.report.exact, b.report.recomputed, b.report.reused), (12, recomputed, 42 - recomputed), "{model:?}");
        assert_eq!(b.report.other, p.len() - 42 - 5, "{model:?}: the lead came with the first span");
        let exact_to = if r == 1.0 { n } else { 17 };
        for l in 0..m.config.n_layer {
            for values in [false, true] {
                assert_eq!(diff(&kv, &reference, l, values, 0..exact_to).0, 0.0, "{model:?}: layer {l} at {r}");
            }
        }
        if r == 0.0 {
            assert!(diff(&kv, &reference, last, true, at..at + len).0 > 0.0, "{model:?}: the moved span kept reused KV");
        }
    }
}

#[test]
fn smollm2() {
    check(RealModel::SmolLM2);
}

#[test]
fn gemma3() {
    check(RealModel::Gemma3);
}
