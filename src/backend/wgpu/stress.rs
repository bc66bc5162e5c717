//! Concurrency stress: several threads drive one [`WgpuBackend`] (one device, one queue) at once,
//! each repeating ops whose bits are known from a single-threaded run. Every op must return the
//! same bits and no error. This is the test behind issue 7's open question (attention mismatches
//! in `wgpu_kernels_are_batch_invariant` when several GPU tests ran at once); see
//! `WgpuContext::map_read` for the cause that was found.

use std::sync::Arc;

use half::f16;

use super::tests::{context, uniform};
use super::{WgpuBackend, WgpuError};
use crate::backend::{AttentionArgs, WeightView};
use crate::gguf::synth::random_matrix;
use crate::gguf::GgmlType;

/// One op of the stress mix and its inputs.
struct Case {
    q: Vec<f32>,
    k: Vec<f16>,
    v: Vec<f16>,
    positions: Vec<u32>,
    w: Vec<u8>,
    x: Vec<f32>,
}

const HEADS: (usize, usize, usize) = (4, 2, 64);
const CAP: usize = 200;
const ROWS: usize = 48;
const COLS: usize = 256;

fn case(seed: u64) -> Case {
    let (n_head, n_kv, hd) = HEADS;
    let positions: Vec<u32> = (150..150 + 1 + (seed as u32 % 9)).collect();
    let f16s = |s, n| uniform(s, n).into_iter().map(f16::from_f32).collect::<Vec<f16>>();
    Case {
        q: uniform(seed * 7 + 1, positions.len() * n_head * hd),
        k: f16s(seed * 7 + 2, n_kv * CAP * hd),
        v: f16s(seed * 7 + 3, n_kv * CAP * hd),
        positions,
        w: random_matrix(GgmlType::Q4_0, ROWS, COLS, 0.0, 1.0, seed * 7 + 4).expect("weights"),
        x: uniform(seed * 7 + 5, 3 * COLS),
    }
}

/// (attention output, matmul output) of `c` on `gpu`, or the first error.
fn run(gpu: &WgpuBackend, c: &Case) -> Result<(Vec<f32>, Vec<f32>), WgpuError> {
    let (n_head, n_kv_head, head_dim) = HEADS;
    let mut att = vec![0f32; c.q.len()];
    gpu.try_attention(&mut AttentionArgs {
        q: &c.q,
        k_cache: &c.k,
        v_cache: &c.v,
        capacity: CAP,
        positions: &c.positions,
        n_head,
        n_kv_head,
        head_dim,
        window: None,
        out: &mut att,
    })?;
    let w = WeightView::new(GgmlType::Q4_0, ROWS, COLS, &c.w).ok_or_else(|| WgpuError::Unsupported("view".into()))?;
    let mut mm = vec![0f32; 3 * ROWS];
    gpu.try_matmul(w, &c.x, 3, &mut mm)?;
    Ok((att, mm))
}

#[test]
fn wgpu_backend_from_many_threads_is_deterministic() {
    let Some(ctx) = context() else {
        return eprintln!("skipped: no wgpu adapter");
    };
    // Deliberately no gpu_lock(): other GPU tests may run at the same time, which is the point.
    let gpu = Arc::new(WgpuBackend::new(ctx));
    let cases: Vec<Case> = (0..4).map(case).collect();
    let expected: Vec<_> = cases.iter().map(|c| run(&gpu, c).expect("single-threaded run")).collect();
    let threads = 6;
    let iters: usize = std::env::var("FORGE_STRESS_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(25);
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (gpu, cases, expected) = (&gpu, &cases, &expected);
                s.spawn(move || {
                    let mut bad = Vec::new();
                    for i in 0..iters {
                        let k = (t + i) % cases.len();
                        match run(gpu, &cases[k]) {
                            Err(e) => bad.push(format!("thread {t} iter {i}: error {e}")),
                            Ok((a, m)) => {
                                let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                                if !same(&a, &expected[k].0) || !same(&m, &expected[k].1) {
                                    bad.push(format!("thread {t} iter {i}: case {k} bits differ"));
                                }
                            }
                        }
                    }
                    bad
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("thread")).collect()
    });
    assert!(failures.is_empty(), "{} of {} ops failed: {:#?}", failures.len(), threads * iters, &failures[..failures.len().min(10)]);
}
