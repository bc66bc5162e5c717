//! The lane kernel against the single-row kernel (bitwise), and an in-process speed comparison.

use half::f16;

use super::super::attn512::{self, Row};
use super::*;
use crate::backend::cpu::testutil::rand_f32;
use crate::backend::simd::SimdLevel;

/// Runs `attend_lanes` (or, with `old`, `attn512::attend_rows` in blocks of its own row count) on
/// rows `q` ([n, g, hd]) with the given ends; returns outputs and (max, sum) pairs.
#[allow(clippy::too_many_arguments)]
fn run(old: bool, q: &[f32], ends: &[usize], keys: &[f16], vals: &[f16], start: usize, hd: usize, g: usize, with_ml: bool) -> (Vec<f32>, Vec<f32>) {
    let n = ends.len();
    let mut got = vec![0f32; n * g * hd];
    let mut got_ml = vec![0f32; n * 2 * g];
    {
        let mut rows: Vec<Row<'_>> = Vec::new();
        let (mut outs, mut mls) = (got.chunks_exact_mut(g * hd), got_ml.chunks_exact_mut(2 * g));
        for (r, &end) in ends.iter().enumerate() {
            let (out, ml) = (outs.next().unwrap(), mls.next().unwrap());
            rows.push(Row { q: &q[r * g * hd..(r + 1) * g * hd], end, out, ml: with_ml.then_some(ml) });
        }
        // SAFETY: the callers checked avx512f; supports(hd, g) holds for their shapes.
        unsafe {
            if old {
                for chunk in rows.chunks_mut(attn512::max_rows(hd, g)) {
                    attn512::attend_rows(chunk, keys, vals, start, hd, 0.125);
                }
            } else {
                attend_lanes(&mut rows, keys, vals, start, hd, 0.125);
            }
        }
    }
    (got, got_ml)
}

/// Rows of different lengths in one call (ending inside a sub-tile, at a tile edge, past the
/// others, one with no keys in the last tile; all lanes used and part of them), normalized or
/// with (max, sum): each row's output bitwise what `attn512::attend_range` gives it alone.
#[test]
fn attend_lanes_equals_single_row_calls_bitwise() {
    if !SimdLevel::Avx512Vnni.supported() {
        return;
    }
    for (hd, g) in [(64, 3), (64, 1), (64, 2), (64, 8), (48, 5), (128, 4), (256, 4), (256, 8)] {
        let n_keys = 300;
        let keys: Vec<f16> = rand_f32(1, n_keys * hd).into_iter().map(f16::from_f32).collect();
        let vals: Vec<f16> = rand_f32(2, n_keys * hd).into_iter().map(f16::from_f32).collect();
        let q = rand_f32(3, MAX_ROWS * g * hd);
        let cases: [(usize, [usize; 16]); 3] = [
            (0, [130, 131, 256, 129, 140, 255, 257, 1, 300, 299, 128, 127, 200, 33, 34, 35]),
            (128, [300, 150, 129, 160, 299, 200, 256, 257, 290, 291, 292, 293, 294, 295, 296, 297]),
            (0, [1, 17, 32, 33, 2, 16, 31, 64, 5, 6, 7, 8, 9, 10, 11, 12]),
        ];
        let mr = max_rows(hd, g);
        for (start, ends) in cases.iter().flat_map(|(s, e)| [(*s, &e[..mr]), (*s, &e[..mr.min(3)]), (*s, &e[..mr.div_ceil(2)])]) {
            for with_ml in [false, true] {
                let (got, got_ml) = run(false, &q, ends, &keys, &vals, start, hd, g, with_ml);
                attn512::assert_rows_equal_single_row_calls(&got, &got_ml, &q, ends, &keys, &vals, start, hd, g, with_ml);
            }
        }
    }
}

/// In-process speed of the lane kernel against `attn512::attend_rows` on the same data: a
/// prefill block of `max_rows` rows over one segment of 512 keys, at depth 512 (the causal first
/// segment: rows end at 497..512) and 4096 (the last full segment, with (max, sum)), the minimum
/// of many alternating calls, in ns per (query head, key). Run with
/// `cargo test --release --lib attn512q::tests::lanes_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn lanes_speed() {
    if !SimdLevel::Avx512Vnni.supported() {
        println!("no AVX-512 here");
        return;
    }
    let reps: usize = std::env::var("FORGE_SPEED_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(400);
    for (hd, g) in [(64, 3), (256, 4)] {
        for depth in [512usize, 4096] {
            let keys: Vec<f16> = rand_f32(11, depth * hd).into_iter().map(|x| f16::from_f32(x * 0.5)).collect();
            let vals: Vec<f16> = rand_f32(12, depth * hd).into_iter().map(f16::from_f32).collect();
            let nr = max_rows(hd, g);
            let q = rand_f32(13, nr * g * hd);
            let start = depth - 512;
            let ends: Vec<usize> = (0..nr).map(|r| if depth == 512 { 512 - nr + 1 + r } else { depth }).collect();
            let pairs: usize = ends.iter().map(|e| (e - start) * g).sum();
            let with_ml = depth > 512;
            let (mut best_old, mut best_new) = (f64::MAX, f64::MAX);
            let (a, b) = (run(true, &q, &ends, &keys, &vals, start, hd, g, with_ml), run(false, &q, &ends, &keys, &vals, start, hd, g, with_ml));
            assert!(a.0.iter().zip(&b.0).all(|(x, y)| x.to_bits() == y.to_bits()), "old and new differ");
            for _ in 0..reps {
                let t = std::time::Instant::now();
                std::hint::black_box(run(true, &q, &ends, &keys, &vals, start, hd, g, with_ml));
                best_old = best_old.min(t.elapsed().as_nanos() as f64);
                let t = std::time::Instant::now();
                std::hint::black_box(run(false, &q, &ends, &keys, &vals, start, hd, g, with_ml));
                best_new = best_new.min(t.elapsed().as_nanos() as f64);
            }
            let (o, n) = (best_old / pairs as f64, best_new / pairs as f64);
            println!("hd {hd} g {g} rows {nr} depth {depth}: attend_rows {o:.3} ns, attend_lanes {n:.3} ns per (query head, key); {:.2}x", o / n);
        }
    }
}
