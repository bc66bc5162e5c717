//! HIP-only checks: batch invariance of the kernels (every matmul tile,
//! every batch, bitwise), detection that never fails, and decode == prefill bitwise through the
//! engine on synthetic models (every tile, with and without graphs), with the logits against the
//! CPU engine's. Every HIP kernel against the CPU scalar reference, one test body per op on every
//! backend present, is in `backend/tests.rs`; its HIP tolerances:
//! * matmul, F32 / F16 / BF16 weights, and Q4_0 / Q4_1 / Q8_0 (HIP quantizes the activations to
//!   q8 exactly as the CPU does, so the integer block sums are the CPU's): `4e-5 · Σ|w·x| + 1e-6`,
//!   the float summation order alone (recursive-summation bound for 512 terms: 3.1e-5).
//! * matmul, Q4_K / Q6_K: the same plus twice `amax_b / 254 · Σ_b|w|` per 256-block (the CPU
//!   quantizes activations per 256 values, HIP per 32: both within that of the exact product).
//! * matmul against the exact (f64) product of the dequantized weights: the float term plus the q8
//!   rounding of the activations, `amax_b · (1/254 + 2^-11) · Σ_b|w|` per 32-block.
//! * RMSNorm: `2e-5 · |ref| + 1e-7`. RoPE: bitwise (products rounded one by one as the CPU does).
//! * attention: `2e-5` absolute on values in [-1, 1] (exp within a few ulp, chunk merges).
//! * SiLU·mul: `2e-6 · |ref| + 1e-7`. Residual add, embedding lookup: bitwise.
//!
//! `FORGE_HIP_REQUIRED=1` turns "no HIP device" into a failure (for runs on a GPU machine).

use std::sync::Arc;

use super::{AttGroup, HipBackend, HipContext, HipLayers, Tile};
use crate::backend::cpu::{CpuBackend, SimdLevel};
use crate::backend::offload::LayerOffload;
use crate::backend::wgpu::tests::{f16s, uniform, weights};
use crate::backend::tests::attention;
use crate::backend::{Backend, WeightView};
use crate::gguf::synth::{tiny_shape, write_synth_model};
use crate::gguf::GgmlType;

fn context() -> Option<Arc<HipContext>> {
    crate::backend::tests::hip_context()
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

/// Every tile and every batch gives each (row, token) the same bits: a batch at once on each tile,
/// and single tokens alone on the one-token tile. Shapes: 13 tokens over 16 blocks per row, and 70
/// tokens over 21 blocks (three 32-token and two 64-token tensor-core token tiles, the last ones
/// partial; a last K chunk of 5 blocks; 130 rows: three row tiles, the last partial).
#[test]
fn hip_matmul_is_batch_invariant_bitwise() {
    let Some(ctx) = context() else { return };
    for (rows, cols, n_tok) in [(70, 512, 13), (130, 672, 70)] {
        for ty in crate::backend::hip::kernels::HIP_TYPES {
            if cols % ty.block_elems() != 0 {
                continue;
            }
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
            assert_eq!(run(Tile::Mma, &x, n_tok), t8, "{ty:?} {rows}x{cols}: Mma vs T8");
            assert_eq!(run(Tile::Mma64, &x, n_tok), t8, "{ty:?} {rows}x{cols}: Mma64 vs T8");
            assert_eq!(run(Tile::T16, &x, n_tok), t8, "{ty:?} {rows}x{cols}: T16 vs T8");
            assert_eq!(run(Tile::T4, &x, n_tok), t8, "{ty:?} {rows}x{cols}: T4 vs T8");
            assert_eq!(run(Tile::T1, &x, n_tok), t8, "{ty:?} {rows}x{cols}: T1 vs T8");
            for t in [0, 5, 12] {
                assert_eq!(run(Tile::T1, &x[t * cols..(t + 1) * cols], 1), t8[t * rows..(t + 1) * rows], "{ty:?} {rows}x{cols}: token {t} alone");
            }
        }
    }
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

/// The default tile is one function of (rows, tokens): `Mma64` only where it fills the GPU; the
/// default attention grouping one of (tokens, KV-head CTAs).
#[test]
fn tile_and_attention_choices_are_functions_of_the_shape() {
    assert_eq!(Tile::choose(2048, 1), Tile::T1);
    assert_eq!(Tile::choose(2048, 8), Tile::T8);
    assert_eq!(Tile::choose(2048, 32), Tile::Mma);
    assert_eq!(Tile::choose(2048, 512), Tile::Mma64); // 1.1B: 256 tiles of 64 x 64
    assert_eq!(Tile::choose(960, 512), Tile::Mma); // SmolLM2's q|k|v: 120
    assert_eq!(Tile::choose(1536, 512), Tile::Mma64); // 192
    // attention: per token below 32 tokens; fused from 256 KV-head CTAs (the 1.1B at 512 tokens: 4
    // KV heads x 128 groups of 4 tokens), else by KV head (SmolLM2: 3 x 52)
    assert_eq!(AttGroup::choose(8, 512), AttGroup::PerToken);
    assert_eq!(AttGroup::choose(512, 512), AttGroup::KvFused);
    assert_eq!(AttGroup::choose(512, 156), AttGroup::KvHead);
    assert_eq!(AttGroup::choose(512, 0), AttGroup::KvHead);
}

/// The grouped attention kernels (a CTA per group of 4 tokens; per KV head and 32 / (n_head /
/// n_kv) tokens, with or without the merge fused in) give every token the bits of the one-token kernel: runs within one chunk, across
/// chunk edges, partial last groups, scattered positions, GQA (1 to 32 query heads per KV head,
/// TinyLlama's 32/4 and SmolLM2's 9/3 among them) and every head size; and they match the CPU
/// reference within `2e-5`.
#[test]
fn hip_grouped_attention_equals_the_per_token_kernel_bitwise() {
    let Some(ctx) = context() else { return };
    let cpu = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("pool");
    let per_token = HipBackend::new(ctx.clone()).with_attention_groups(Some(AttGroup::PerToken));
    let grouped: Vec<HipBackend> = [AttGroup::Tokens4, AttGroup::KvHead, AttGroup::KvFused].map(|g| HipBackend::new(ctx.clone()).with_attention_groups(Some(g))).into();
    let cap = 1100;
    let scattered: Vec<u32> = vec![5, 300, 129, 128, 127, 1000, 0, 64, 255, 256, 1099, 3, 700];
    let shapes = [(4, 2, 64), (8, 2, 32), (2, 1, 128), (4, 4, 256), (32, 4, 64), (9, 3, 64), (32, 1, 32), (3, 3, 64)];
    for (n_head, n_kv, hd) in shapes {
        let (k, v) = (f16s(21, n_kv * cap * hd), f16s(22, n_kv * cap * hd));
        for positions in [(0..37).collect::<Vec<u32>>(), (120..141).collect(), (250..300).collect(), (1015..1030).collect(), scattered.clone()] {
            let q = uniform(23, positions.len() * n_head * hd);
            let one = attention(&per_token, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
            let reference = attention(&cpu, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
            for g in &grouped {
                let group = attention(g, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
                for (i, ((a, b), r)) in group.iter().zip(&one).zip(&reference).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "hd {hd} heads {n_head}/{n_kv} positions {:?}.. [{i}]: {a} vs {b}", &positions[..1]);
                    assert!((a - r).abs() <= 2e-5, "hd {hd} positions {:?}.. [{i}]: {a} vs the CPU's {r}", &positions[..1]);
                }
            }
        }
    }
    assert!(per_token.take_error().is_none() && grouped.iter().all(|g| g.take_error().is_none()));
}

/// A group of tokens from two caches (continuous batching) is taken run by run, with the bits of
/// the one-token kernel: runs of 1, 2, 3 and 5 tokens of alternating sequences (every grouped kernel).
#[test]
fn hip_grouped_attention_over_two_caches_equals_the_per_token_kernel() {
    use super::runtime::DevBuf;
    let Some(ctx) = context() else { return };
    let (n_head, n_kv, hd, cap) = (4, 2, 64, 400);
    let bits = |c: &[half::f16]| -> Vec<u16> { c.iter().map(|h| h.to_bits()).collect() };
    // (sequence, position): runs A, BB, AAA, BBBBB, A, ... over both caches
    let toks: Vec<(usize, u32)> = (0..40u32).map(|i| (usize::from(matches!(i % 11, 1 | 2 | 6..=10)), 90 + i * 7)).collect();
    let run = |grouped: AttGroup| -> Vec<u32> {
        let _stream = ctx.lock();
        let (rt, kern) = (ctx.runtime(), ctx.kernels());
        let caches: Vec<(DevBuf, DevBuf)> = (0..2u64)
            .map(|s| {
                let k = DevBuf::from_bytes(rt, bytemuck::cast_slice(&bits(&f16s(30 + s, n_kv * cap * hd)))).expect("k");
                let v = DevBuf::from_bytes(rt, bytemuck::cast_slice(&bits(&f16s(40 + s, n_kv * cap * hd)))).expect("v");
                (k, v)
            })
            .collect();
        let tok: Vec<u64> = toks.iter().flat_map(|&(s, p)| [caches[s].0.ptr(), caches[s].1.ptr(), cap as u64 | ((p as u64) << 32)]).collect();
        let tb = DevBuf::from_bytes(rt, bytemuck::cast_slice(&tok)).expect("tok");
        let n = toks.len();
        let chunks = (toks.iter().map(|t| t.1).max().unwrap_or(0) as usize + 1).div_ceil(super::kernels::ATT_CH);
        let qb = DevBuf::from_f32(rt, &uniform(24, n * n_head * hd)).expect("q");
        let part = DevBuf::new(rt, n * n_head * chunks * (hd + 2) * 4).expect("part");
        let ob = DevBuf::new(rt, n * n_head * hd * 4).expect("out");
        kern.attention(&**rt, qb.ptr(), n_head * hd, (n_head, n_kv, hd), tb.ptr(), 0, part.ptr(), chunks, ob.ptr(), None, n, Some(grouped)).expect("attention");
        let mut out = vec![0f32; n * n_head * hd];
        ob.read_f32(&mut out).expect("read");
        out.iter().map(|v| v.to_bits()).collect()
    };
    let one = run(AttGroup::PerToken);
    assert_eq!(run(AttGroup::Tokens4), one);
    assert_eq!(run(AttGroup::KvHead), one);
    assert_eq!(run(AttGroup::KvFused), one);
}

/// RMSNorm (+ q8) gives the same bits on every grid (a CTA per 256-element slice or per row),
/// with or without its f32 output, and reading gathered rows; SiLU·mul's q8 blocks are the same
/// with or without its f32 output and on its prefill grid (17 rows) and decode grid (3 rows).
/// Widths: 576 (a partial last slice), 2048, 4640 (past the slices kept in registers).
#[test]
fn hip_norm_grids_and_outputs_give_the_same_bits() {
    use super::kernels::NormGrid;
    use super::runtime::DevBuf;
    let Some(ctx) = context() else { return };
    let _stream = ctx.lock();
    let (rt, k) = (ctx.runtime(), ctx.kernels());
    let bytes = |b: &DevBuf, len: usize| -> Vec<u8> {
        let mut out = vec![0u8; len];
        rt.download(&mut out, b.ptr()).expect("download");
        out
    };
    for (e, n) in [(576, 3), (2048, 5), (4640, 2), (2048, 17)] {
        let x: Vec<f32> = uniform(40, n * e).iter().map(|v| v * 3.0).collect();
        let w: Vec<f32> = uniform(41, e).iter().map(|v| 1.0 + 0.1 * v).collect();
        let (xb, wb) = (DevBuf::from_f32(rt, &x).expect("x"), DevBuf::from_f32(rt, &w).expect("w"));
        let (fl, ql) = (n * e * 4, n * e / 32 * super::kernels::Q8_BYTES);
        let run = |rows: Option<&DevBuf>, grid: NormGrid, with_f32: bool| -> (Vec<u8>, Vec<u8>) {
            let (xn, xq) = (DevBuf::new(rt, fl).expect("xn"), DevBuf::new(rt, ql).expect("xq"));
            let f = with_f32.then(|| xn.ptr());
            k.rmsnorm_rows(&**rt, xb.ptr(), rows.map(|r| r.ptr()), wb.ptr(), e, 1e-5, f, Some(xq.ptr()), n, Some(grid)).expect("rmsnorm");
            (if with_f32 { bytes(&xn, fl) } else { Vec::new() }, bytes(&xq, ql))
        };
        let (xn0, xq0) = run(None, NormGrid::Slice, true);
        for grid in NormGrid::ALL {
            let (xn, xq) = run(None, grid, true);
            assert!(xn == xn0 && xq == xq0, "e {e}: {grid:?} vs Slice");
            assert_eq!(run(None, grid, false).1, xq0, "e {e}: {grid:?} without f32");
            // rows in reverse order: output row t is input row n-1-t
            let ids: Vec<u32> = (0..n as u32).rev().collect();
            let rb = DevBuf::from_bytes(rt, bytemuck::cast_slice(&ids)).expect("rows");
            let (gxn, gxq) = run(Some(&rb), grid, true);
            let (fr, qr) = (e * 4, e / 32 * super::kernels::Q8_BYTES);
            for t in 0..n {
                let s = n - 1 - t;
                assert_eq!(gxn[t * fr..(t + 1) * fr], xn0[s * fr..(s + 1) * fr], "e {e}: {grid:?} gathered row {t}");
                assert_eq!(gxq[t * qr..(t + 1) * qr], xq0[s * qr..(s + 1) * qr], "e {e}: {grid:?} gathered row {t} q8");
            }
        }
        // SiLU·mul over [n, 2*e] with and without its f32 output
        let gu = DevBuf::from_f32(rt, &[x.clone(), x.iter().map(|v| v * 0.5).collect()].concat()).expect("gu");
        let silu = |with_f32: bool, rows: usize| -> Vec<u8> {
            let (act, actq) = (DevBuf::new(rt, fl).expect("act"), DevBuf::new(rt, ql).expect("actq"));
            k.silu_mul_q8(&**rt, gu.ptr(), e, with_f32.then(|| act.ptr()), Some(actq.ptr()), rows).expect("silu");
            bytes(&actq, rows * e / 32 * super::kernels::Q8_BYTES)
        };
        let all = silu(true, n);
        assert_eq!(all, silu(false, n), "e {e}: silu_mul_q8 with and without f32");
        let few = silu(false, 3.min(n));
        assert_eq!(all[..few.len()], few[..], "e {e}: silu_mul_q8 on {n} rows vs their first 3");
    }
}
