//! Every HIP kernel against the CPU's scalar reference: one test body per op, run on every
//! backend present (CPU scalar, CPU SIMD, and the HIP device with each matmul tile when there is
//! one; without one the HIP part is skipped with the reason). Then HIP-only checks: exact
//! dequantization, batch invariance of the kernels (every tile, every batch, bitwise), and
//! decode == prefill bitwise through the engine on synthetic models.
//!
//! Tolerances, `|backend - scalar reference|` per output:
//! * matmul, F32 / F16 / BF16 weights, and Q4_0 / Q4_1 / Q8_0 (HIP quantizes the activations to
//!   q8 exactly as the CPU does, so the integer block sums are the CPU's): `4e-5 · Σ|w·x| + 1e-6`,
//!   the float summation order alone (recursive-summation bound for 512 terms: 3.1e-5).
//! * matmul, Q4_K / Q6_K: the same plus twice `amax_b / 254 · Σ_b|w|` per 256-block (the CPU
//!   quantizes activations per 256 values, HIP per 32: both within that of the exact product).
//! * HIP matmul is also checked against the exact (f64) product of the dequantized weights at the
//!   float term plus the q8 rounding of its activations, `amax_b · (1/254 + 2^-11) · Σ_b|w|` per
//!   32-block, so a dequantization bug cannot hide inside an allowance.
//! * RMSNorm: `2e-5 · |ref| + 1e-7`. RoPE: bitwise on HIP (products rounded one by one as the
//!   CPU does); `2.4e-7 · (|x0| + |x1|)` for the CPU SIMD levels.
//! * attention: `2e-5` absolute on values in [-1, 1] (exp within a few ulp, chunk merges).
//! * SiLU·mul: `2e-6 · |ref| + 1e-7`. Residual add, embedding lookup: bitwise.
//!
//! `FORGE_HIP_REQUIRED=1` turns "no HIP device" into a failure (for runs on a GPU machine).

use std::sync::Arc;

use super::{HipBackend, HipContext, HipLayers, Tile};
use crate::backend::cpu::ops::rope_table;
use crate::backend::cpu::{CpuBackend, SimdLevel};
use crate::backend::offload::LayerOffload;
use crate::backend::wgpu::tests::{f16s, uniform, weights};
use crate::backend::{AttentionArgs, Backend, WeightView};
use crate::gguf::synth::{tiny_shape, write_synth_model};
use crate::gguf::{dequantize_row, GgmlType, QK};

fn context() -> Option<Arc<HipContext>> {
    match HipContext::get() {
        Ok(c) => Some(c),
        Err(e) => {
            assert!(e.is_unavailable(), "HIP detection failed loudly: {e}");
            assert!(std::env::var_os("FORGE_HIP_REQUIRED").is_none(), "FORGE_HIP_REQUIRED is set and there is no HIP device: {e}");
            eprintln!("no HIP device ({e}): the HIP part of this test is skipped");
            None
        }
    }
}

struct Present {
    name: String,
    backend: Arc<dyn Backend>,
    hip: Option<Arc<HipBackend>>,
}

/// Every backend on this machine, the CPU scalar reference first; HIP once per matmul tile.
fn backends() -> Vec<Present> {
    let cpu = |s| -> Present {
        let b = Arc::new(CpuBackend::with_simd(2, s).expect("pool"));
        Present { name: b.name(), backend: b, hip: None }
    };
    let mut v = vec![cpu(SimdLevel::Scalar)];
    if SimdLevel::detect() != SimdLevel::Scalar {
        v.push(cpu(SimdLevel::detect()));
    }
    if let Some(ctx) = context() {
        for tile in [None, Some(Tile::T1), Some(Tile::T4), Some(Tile::T8), Some(Tile::T16)] {
            let h = Arc::new(HipBackend::new(ctx.clone()).with_tile(tile));
            v.push(Present { name: h.name(), backend: h.clone(), hip: Some(h) });
        }
    }
    v
}

fn no_hip_errors(all: &[Present]) {
    for p in all {
        if let Some(e) = p.hip.as_ref().and_then(|h| h.take_error()) {
            panic!("{}: HIP error: {e}", p.name);
        }
    }
}

const WEIGHT_TYPES: [GgmlType; 8] =
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K];

/// Σ over `n`-blocks of amax(x_b) · e · Σ_b|w|.
fn block_bound(w: &[f32], x: &[f32], n: usize, e: f64) -> f64 {
    (0..w.len() / n)
        .map(|b| {
            let r = b * n..(b + 1) * n;
            let amax = x[r.clone()].iter().fold(0f64, |a, v| a.max(v.abs() as f64));
            amax * e * w[r].iter().map(|v| v.abs() as f64).sum::<f64>()
        })
        .sum()
}

#[test]
fn detection_never_fails() {
    let line = super::status();
    eprintln!("dgpu: {line}");
    assert!(!line.is_empty());
    if let Err(e) = HipContext::get() {
        assert!(e.is_unavailable(), "{e}");
        assert!(std::env::var_os("FORGE_HIP_REQUIRED").is_none(), "FORGE_HIP_REQUIRED is set and there is no HIP device: {e}");
        // the reason names both platforms (AMD first, then NVIDIA)
        assert!(line.contains("AMD") && line.contains("NVIDIA"), "{line}");
    }
}

#[test]
fn matmul_every_type_on_every_backend() {
    let all = backends();
    for ty in WEIGHT_TYPES {
        // 1024 columns: several items per lane and (Q4_0: 64 items) one lane group; 3 tokens and 11
        let shapes: &[(usize, usize, usize)] = if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) { &[(37, 1024, 11), (5, 256, 1)] } else { &[(37, 1024, 11), (9, 96, 3)] };
        for &(rows, cols, n_tok) in shapes {
            let data = weights(ty, rows, cols, 100 + cols as u64);
            let w = WeightView::new(ty, rows, cols, &data).expect("view");
            let x = uniform(1, n_tok * cols);
            let mut wf = vec![0f32; rows * cols];
            for (r, dst) in wf.chunks_exact_mut(cols).enumerate() {
                dequantize_row(ty, w.row(r), dst);
            }
            let mut reference = vec![0f32; n_tok * rows];
            all[0].backend.matmul(w, &x, n_tok, &mut reference);
            let k_quant = matches!(ty, GgmlType::Q4K | GgmlType::Q6K);
            for p in &all {
                let mut out = vec![f32::NAN; n_tok * rows];
                p.backend.matmul(w, &x, n_tok, &mut out);
                for t in 0..n_tok {
                    for r in 0..rows {
                        let (wr, xt) = (&wf[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let (got, want) = (out[t * rows + r], reference[t * rows + r]);
                        let float = 4e-5 * wr.iter().zip(xt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum::<f64>() + 1e-6;
                        let quant = if k_quant { 2.0 * block_bound(wr, xt, 256, 1.0 / 254.0) } else { 0.0 };
                        // the CPU SIMD levels quantize K-quant activations their own way too
                        let tol = float + if p.hip.is_some() || k_quant { quant } else { 0.0 };
                        let tol = if p.hip.is_none() && !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) { tol.max(float + block_bound(wr, xt, QK, 1.0 / 254.0)) } else { tol };
                        assert!(((got - want) as f64).abs() <= tol, "{} {ty:?} {rows}x{cols} [t {t}, r {r}]: {got} vs reference {want} (tol {tol:e})", p.name);
                        if p.hip.is_some() {
                            let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let q8 = if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) { 0.0 } else { block_bound(wr, xt, QK, 1.0 / 254.0 + 2f64.powi(-11)) };
                            assert!((got as f64 - exact).abs() <= float + q8 * 1.001, "{} {ty:?} [t {t}, r {r}]: {got} vs exact {exact}", p.name);
                        }
                    }
                }
            }
        }
    }
    no_hip_errors(&all);
}

/// Every tile and every batch gives each (row, token) the same bits: 13 tokens at once on each
/// tile, and each token alone on the one-token tile.
#[test]
fn hip_matmul_is_batch_invariant_bitwise() {
    let Some(ctx) = context() else { return };
    let (rows, cols, n_tok) = (70, 512, 13);
    for ty in WEIGHT_TYPES {
        let data = weights(ty, rows, cols, 7);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let x = uniform(3, n_tok * cols);
        let run = |tile: Tile, x: &[f32], n: usize| -> Vec<u32> {
            let b = HipBackend::new(ctx.clone()).with_tile(Some(tile));
            let mut out = vec![f32::NAN; n * rows];
            b.matmul(w, x, n, &mut out);
            assert!(b.take_error().is_none(), "{ty:?} {tile:?}");
            out.iter().map(|v| v.to_bits()).collect()
        };
        let t8 = run(Tile::T8, &x, n_tok);
        assert_eq!(run(Tile::T16, &x, n_tok), t8, "{ty:?}: T16 vs T8");
        assert_eq!(run(Tile::T4, &x, n_tok), t8, "{ty:?}: T4 vs T8");
        assert_eq!(run(Tile::T1, &x, n_tok), t8, "{ty:?}: T1 vs T8");
        for t in [0, 5, 12] {
            assert_eq!(run(Tile::T1, &x[t * cols..(t + 1) * cols], 1), t8[t * rows..(t + 1) * rows], "{ty:?}: token {t} alone");
        }
    }
}

#[test]
fn rmsnorm_on_every_backend() {
    let all = backends();
    for (dim, n) in [(576, 5), (2600, 3)] {
        let x: Vec<f32> = uniform(2, n * dim).iter().map(|v| v * 3.0).collect();
        let g: Vec<f32> = uniform(3, dim).iter().map(|v| 1.0 + 0.1 * v).collect();
        let mut reference = vec![0f32; n * dim];
        all[0].backend.rmsnorm(&x, &g, 1e-5, &mut reference);
        for p in &all {
            let mut out = vec![f32::NAN; n * dim];
            p.backend.rmsnorm(&x, &g, 1e-5, &mut out);
            for (i, (a, r)) in out.iter().zip(&reference).enumerate() {
                assert!((a - r).abs() <= 2e-5 * r.abs() + 1e-7, "{} dim {dim} [{i}]: {a} vs {r}", p.name);
            }
        }
    }
    no_hip_errors(&all);
}

#[test]
fn rope_on_every_backend() {
    let all = backends();
    let (n_head, hd) = (3, 64);
    let table = rope_table(300, hd, hd, 100000.0);
    let positions: Vec<u32> = vec![0, 1, 7, 128, 299];
    let x0 = uniform(4, positions.len() * n_head * hd);
    let mut reference = x0.clone();
    all[0].backend.rope(&mut reference, &positions, n_head, hd, &table);
    for p in &all {
        let mut x = x0.clone();
        p.backend.rope(&mut x, &positions, n_head, hd, &table);
        for (i, (a, r)) in x.iter().zip(&reference).enumerate() {
            let pair = i & !1;
            let tol = if p.hip.is_some() { 0.0 } else { 2.4e-7 * (x0[pair].abs() + x0[pair + 1].abs()) };
            assert!((a - r).abs() <= tol, "{} [{i}]: {a} vs {r}", p.name);
        }
    }
    no_hip_errors(&all);
}

fn attention(b: &dyn Backend, q: &[f32], k: &[half::f16], v: &[half::f16], cap: usize, pos: &[u32], heads: (usize, usize, usize)) -> Vec<f32> {
    let (n_head, n_kv_head, head_dim) = heads;
    let mut out = vec![f32::NAN; q.len()];
    b.attention(AttentionArgs { q, k_cache: k, v_cache: v, capacity: cap, positions: pos, n_head, n_kv_head, head_dim, out: &mut out });
    out
}

#[test]
fn attention_on_every_backend() {
    let all = backends();
    for (n_head, n_kv, hd) in [(4, 2, 64), (2, 1, 128), (8, 2, 32)] {
        let cap = 300;
        let (k, v) = (f16s(5, n_kv * cap * hd), f16s(6, n_kv * cap * hd));
        // decode-like (one late position), prefill-like (a run crossing a chunk edge), position 0
        for positions in [vec![299u32], (120..140).collect::<Vec<u32>>(), vec![0]] {
            let q = uniform(7, positions.len() * n_head * hd);
            let reference = attention(&*all[0].backend, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
            for p in &all {
                let out = attention(&*p.backend, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
                for (i, (a, r)) in out.iter().zip(&reference).enumerate() {
                    assert!((a - r).abs() <= 2e-5, "{} hd {hd} positions {:?} [{i}]: {a} vs {r}", p.name, &positions[..1]);
                }
            }
        }
    }
    no_hip_errors(&all);
}

/// A token's attention output is the same bits alone and in a batch.
#[test]
fn hip_attention_is_batch_invariant_bitwise() {
    let Some(ctx) = context() else { return };
    let gpu = HipBackend::new(ctx);
    let (n_head, n_kv, hd, cap) = (4, 2, 64, 400);
    let (k, v) = (f16s(16, n_kv * cap * hd), f16s(17, n_kv * cap * hd));
    let positions: Vec<u32> = (250..300).collect();
    let q = uniform(18, positions.len() * n_head * hd);
    let batch = attention(&gpu, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
    let wdt = n_head * hd;
    for (t, p) in positions.iter().enumerate() {
        let one = attention(&gpu, &q[t * wdt..(t + 1) * wdt], &k, &v, cap, &[*p], (n_head, n_kv, hd));
        assert!(one.iter().zip(&batch[t * wdt..]).all(|(a, c)| a.to_bits() == c.to_bits()), "attention token {t}");
    }
    assert!(gpu.take_error().is_none());
}

#[test]
fn silu_mul_and_add_on_every_backend() {
    let all = backends();
    let n = 1000;
    let (g0, u) = (uniform(8, n), uniform(9, n));
    let mut reference = g0.clone();
    all[0].backend.silu_mul(&mut reference, &u);
    let mut sum_ref = g0.clone();
    all[0].backend.add(&mut sum_ref, &u);
    for p in &all {
        let mut g = g0.clone();
        p.backend.silu_mul(&mut g, &u);
        for (i, (a, r)) in g.iter().zip(&reference).enumerate() {
            assert!((a - r).abs() <= 2e-6 * r.abs() + 1e-7, "{} silu_mul [{i}]: {a} vs {r}", p.name);
        }
        let mut s = g0.clone();
        p.backend.add(&mut s, &u);
        assert!(s.iter().zip(&sum_ref).all(|(a, r)| a.to_bits() == r.to_bits()), "{}: add is not bitwise equal", p.name);
    }
    no_hip_errors(&all);
}

#[test]
fn hip_embedding_is_exact_dequantization() {
    let Some(ctx) = context() else { return };
    let gpu = HipBackend::new(ctx);
    let (rows, cols) = (50, 512);
    let ids = [0u32, 49, 7, 7, 23];
    for ty in WEIGHT_TYPES {
        let data = weights(ty, rows, cols, 11);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let mut out = vec![f32::NAN; ids.len() * cols];
        gpu.embed(w, &ids, &mut out).expect("embed");
        for (t, &id) in ids.iter().enumerate() {
            let mut want = vec![0f32; cols];
            dequantize_row(ty, w.row(id as usize), &mut want);
            let got = &out[t * cols..(t + 1) * cols];
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: row {id} differs from dequantize_row");
        }
    }
}

/// The engine with every layer (and the head) on HIP, forced onto `tile` (None: by batch size),
/// with or without recorded graphs.
fn hip_model(ctx: &Arc<HipContext>, path: &std::path::Path, tile: Option<Tile>, graphs: bool) -> crate::engine::Model {
    let mut model = crate::engine::Model::load(path, Arc::new(CpuBackend::with_simd(1, SimdLevel::Scalar).expect("pool"))).expect("load");
    let n = model.config.n_layer;
    let seg = HipLayers::new(ctx.clone(), &model, 0..n, 256, true).expect("upload").with_tile(tile).without_graphs(!graphs);
    model.offload(vec![Box::new(seg) as Box<dyn LayerOffload>]).expect("offload");
    model
}

/// Logits of every position, feeding `tokens` in chunks (cycled), bit patterns.
fn logits_in_chunks(model: &crate::engine::Model, tokens: &[u32], chunks: &[usize]) -> Vec<Vec<u32>> {
    let mut state = model.new_state(chunks.iter().copied().max().unwrap_or(1));
    let mut kv = model.new_kv(tokens.len());
    let mut out = Vec::new();
    let mut at = 0;
    for &c in chunks.iter().cycle() {
        if at >= tokens.len() {
            break;
        }
        let end = (at + c).min(tokens.len());
        let seq = crate::engine::SeqBatch { kv: &mut kv, tokens: &tokens[at..end], logits: crate::engine::Logits::All };
        model.forward(&mut state, &mut [seq]).expect("forward");
        for i in 0..end - at {
            out.push(model.logits(&state, i).iter().map(|v| v.to_bits()).collect());
        }
        at = end;
    }
    out
}

/// Decode equals prefill bitwise through the engine on HIP layers, for every tile, on a Q8-path
/// type and a float one; and the logits agree with the scalar CPU engine (f32 weights: both sides
/// f32, 1e-3 of the logits' scale; Q4_0: the same q8 activations, 1e-2 as the wgpu test explains).
#[test]
fn hip_layers_decode_equals_prefill_and_match_the_cpu() {
    let Some(ctx) = context() else { return };
    let tokens: Vec<u32> = (0..150).map(|i| (i * 37 + 5) % 320).collect(); // crosses a 128-key chunk
    for (ty, tol) in [(GgmlType::Q4_0, 1e-2f32), (GgmlType::F32, 1e-3), (GgmlType::Q4_1, 1e-2)] {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        write_synth_model(&tiny_shape(), ty, 3, None, f.path(), |_| {}).expect("synth");
        let model = hip_model(&ctx, f.path(), None, true);
        let prefill = logits_in_chunks(&model, &tokens, &[16]);
        for chunks in [&[1usize][..], &[5, 11, 3]] {
            assert_eq!(logits_in_chunks(&model, &tokens, chunks), prefill, "{ty:?}: chunks {chunks:?} differ from prefill");
        }
        for tile in Tile::ALL {
            assert_eq!(logits_in_chunks(&hip_model(&ctx, f.path(), Some(tile), true), &tokens, &[7, 1]), prefill, "{ty:?}: tile {tile:?}");
        }
        assert_eq!(logits_in_chunks(&hip_model(&ctx, f.path(), None, false), &tokens, &[3, 1]), prefill, "{ty:?}: without graphs");
        let cpu = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::with_simd(1, SimdLevel::Scalar).expect("pool"))).expect("load");
        let reference = logits_in_chunks(&cpu, &tokens[..40], &[40]);
        let scale = reference.iter().flatten().map(|b| f32::from_bits(*b).abs()).fold(0f32, f32::max);
        let worst = reference.iter().flatten().zip(prefill.iter().flatten()).map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs()).fold(0f32, f32::max);
        eprintln!("{ty:?}: max |hip - cpu| logit {worst:e} (scale {scale})");
        assert!(worst <= tol * scale, "{ty:?}: HIP logits differ from the CPU engine's by {worst} (scale {scale})");
    }
}
