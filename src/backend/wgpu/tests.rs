//! wgpu-only checks: the matmul's weights are the dequantized matrix exactly, the KV store's
//! rounding, q8 blocks, batch invariance of the kernels, decode vs prefill through
//! [`WgpuLayers`], the options. Every WGSL kernel against the CPU scalar reference (and the
//! embedding lookup against `dequantize_row`), one test body per op on every backend present, is
//! in `backend/tests.rs` (the wgpu backends there: [`contexts`], software adapters allowed).
//!
//! Tolerances of those tests for wgpu, `|backend - scalar reference|` per output:
//! * matmul, F32 / F16 / BF16 weights: `4e-5 · Σ|w·x| + 1e-6` — both sides accumulate f32 in a
//!   different order; the worst-case recursive-summation bound for 512 terms is 512 · 2^-24 ≈ 3.1e-5.
//! * matmul, Q4_0 / Q5_0 / Q8_0 / Q4_1 weights: the same plus the CPU reference's own 8-bit activation
//!   rounding, bounded per 32-block b by `amax_b · (1/254 + 2^-11) · (Σ_b|w| + 65·|m_b|)`: half a
//!   step of amax/127 per activation plus the f16 rounding of the block scale, and for Q4_1 the
//!   f16 rounding of its block-sum term (m_b is Q4_1's block minimum, 0 otherwise). The GPU uses
//!   f32 activations, so this is the whole expected difference.
//! * matmul, Q4_K / Q5_K / Q6_K: per 256-block `amax_b / 254 · Σ_b|w|` (Q8_K activations keep an f32 scale).
//! * wgpu matmul is also checked against the exact (f64) product of the dequantized weights at
//!   `4e-5 · Σ|w·x| + 1e-6`, so a dequantization bug cannot hide inside the 8-bit allowance.
//! * RMSNorm: `2e-5 · |ref| + 1e-7` (sum of squares in another order, ≤ 3.1e-5 relative worst case
//!   and halved by the square root, plus WGSL's 2.5-ulp sqrt and division).
//! * RoPE: `2.4e-7 · (|x0| + |x1|)` (a fused multiply-add versus two rounded products, |cos|,|sin| ≤ 1).
//! * attention: `2e-5` absolute on values in [-1, 1] (WGSL exp is within 3 + 2|x| ulp, ≤ 35 ulp
//!   here; the tile sums use a tree instead of a chain).
//! * SiLU·mul: `2e-6 · |ref| + 1e-7` (exp ≤ 5 ulp for |x| ≤ 1, 2.5-ulp division, one product).
//! * residual add, embedding lookup, KV store: bitwise.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use half::f16;

use super::{DecodePlan, KvPrecision, WgpuBackend, WgpuContext, WgpuLayers, WgpuOptions, WEIGHT_TYPES};
use crate::backend::tests::attention;
use crate::backend::cpu::CpuBackend;
use crate::backend::WeightView;
use crate::gguf::synth::{random_matrix, tiny_shape, write_synth_model, Rng};
use crate::gguf::{dequantize_row, GgmlType, QK_K};

/// One GPU test at a time: lavapipe runs every dispatch on the machine's own (2, in CI) cores,
/// so concurrent GPU tests only slow each other down. (The mismatches once seen here with several
/// tests at once had another cause, found with `stress.rs`: a read-back could miss its mapping
/// callback when another thread's poll had collected it, the op failed with "map did not
/// complete" and the trait method fell back to the CPU result; `WgpuContext::map_read` now waits
/// for the callback. The stress test runs without this lock.)
pub(crate) fn gpu_lock() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|p| p.into_inner())
}

/// The options of every test context: software adapters allowed, the rest as the service runs.
pub(super) fn test_options() -> WgpuOptions {
    WgpuOptions { allow_software: true, ..WgpuOptions::default() }
}

/// The shared test contexts: the default one, plus two with 32 matmul lanes and the folded
/// decode kernels (software adapters default to 1 lane and the batch kernels for one token),
/// without and with attention_one, so that both reduction layouts and the one-token paths are
/// tested here; where the adapter offers tensor cores, one with Q4_0 on them (`WgpuOptions::coop`).
/// Empty, with a message, when there is no adapter.
pub(crate) fn contexts() -> &'static [Arc<WgpuContext>] {
    static CTX: OnceLock<Vec<Arc<WgpuContext>>> = OnceLock::new();
    CTX.get_or_init(|| match WgpuContext::new(test_options()) {
        Ok(c) => {
            eprintln!("wgpu tests run on {:?}, {} matmul lanes, decode: {}", c.adapter(), c.matmul_lanes(), c.decode_kernels());
            let mut v = vec![c.clone()];
            // Where the adapter offers tensor cores, Q4_0 on them too (`WgpuOptions::coop`)
            if c.coop_offered() {
                match WgpuContext::new(WgpuOptions { coop: true, ..test_options() }) {
                    Ok(o) => {
                        eprintln!("and with Q4_0 on tensor cores: {}", o.coop());
                        v.push(o);
                    }
                    Err(e) => panic!("wgpu context with tensor cores: {e}"),
                }
            }
            // 32 lanes with the one-token kernels: the GPUs' default plan (one-token q|k|v with
            // RoPE + KV store), and with attention_one instead
            for one in [false, true] {
                match WgpuContext::new(WgpuOptions { matmul_lanes: Some(32), decode_kernels: Some(DecodePlan::Fused), attention_one: one, ..test_options() }) {
                    Ok(o) => {
                        eprintln!("and on 32 matmul lanes, decode: {}, attention_one: {one}", o.decode_kernels());
                        v.push(o);
                    }
                    Err(e) if e.is_unavailable() => eprintln!("no 32-lane context: {e}"),
                    Err(e) => panic!("wgpu context with 32 lanes: {e}"),
                }
            }
            v
        }
        Err(e) if e.is_unavailable() => {
            eprintln!("wgpu: {e}; skipping the wgpu backend in these tests");
            Vec::new()
        }
        Err(e) => panic!("wgpu context: {e}"),
    })
}

pub(super) fn context() -> Option<Arc<WgpuContext>> {
    contexts().first().cloned()
}

pub(crate) fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.next_f32() * 2.0 - 1.0).collect()
}

/// Random weights of any type: quantized N(0, 1) values, or for K-quants random blocks with
/// small positive scales.
pub(crate) fn weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    if !matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K) {
        return random_matrix(ty, rows, cols, 0.0, 1.0, seed).expect("quantizable");
    }
    let mut r = Rng::new(seed);
    let mut b: Vec<u8> = (0..rows * ty.row_bytes(cols).expect("blocks")).map(|_| r.next_u64() as u8).collect();
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        let mut put = |at: usize, v: f32| blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) {
            put(0, 0.01 + 0.02 * r.next_f32());
            put(2, 0.004 * r.next_f32());
        } else {
            put(208, 0.005 + 0.01 * r.next_f32());
        }
    }
    b
}

pub(crate) fn f16s(seed: u64, n: usize) -> Vec<f16> {
    uniform(seed, n).into_iter().map(f16::from_f32).collect()
}

/// A table of another shape is refused; the matmul's weights (repacked at upload for some types,
/// pack.rs) are the dequantized matrix exactly. (The embedding lookup against `dequantize_row`:
/// `backend/tests.rs`.)
#[test]
fn wgpu_embed_refuses_and_matmul_weights_are_exact() {
    let _gpu = gpu_lock();
    let Some(ctx) = context() else { return eprintln!("skipped: no wgpu adapter") };
    let gpu = WgpuBackend::new(ctx);
    assert!(gpu.embed(WeightView::new(GgmlType::F32, 2, 32, &[0; 256]).expect("view"), &[2], &mut [0.0; 32]).is_err());
    // The matmul's weights (repacked at upload for some types, pack.rs): a product with the unit
    // vectors is the dequantized matrix, exactly (0 and -0 compare equal).
    let rows = 9;
    for ty in WEIGHT_TYPES {
        let cols = if ty.block_elems() == QK_K { QK_K } else { 96 };
        let data = weights(ty, rows, cols, 12);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let eye: Vec<f32> = (0..cols * cols).map(|i| f32::from(u8::from(i % (cols + 1) == 0))).collect();
        let mut out = vec![f32::NAN; cols * rows];
        gpu.try_matmul(w, &eye, cols, &mut out).expect("matmul");
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            dequantize_row(ty, w.row(r), &mut want);
            assert!((0..cols).all(|c| out[c * rows + r] == want[c]), "{ty:?}: matmul weights of row {r} differ from dequantize_row");
        }
    }
}

#[test]
fn wgpu_kv_store_rounds_like_the_cpu_cache() {
    let _gpu = gpu_lock();
    let Some(ctx) = context() else { return eprintln!("skipped: no wgpu adapter") };
    let gpu = WgpuBackend::new(ctx);
    let (n_kv, hd, cap) = (2, 64, 20);
    let positions = [3u32, 4, 5, 19];
    let k: Vec<f32> = uniform(12, positions.len() * n_kv * hd).iter().map(|v| v * 7.3).collect();
    let v = uniform(13, k.len());
    for f16_cache in [true, false] {
        let (kc, vc) = gpu.kv_store(&k, &v, &positions, n_kv, hd, cap, f16_cache).expect("kv_store");
        for (t, &p) in positions.iter().enumerate() {
            for h in 0..n_kv {
                for d in 0..hd {
                    let (src, dst) = ((t * n_kv + h) * hd + d, (h * cap + p as usize) * hd + d);
                    for (cache, x) in [(&kc, &k), (&vc, &v)] {
                        let got = if f16_cache { (cache[dst / 2] >> (16 * (dst % 2))) & 0xFFFF } else { cache[dst] };
                        let want = if f16_cache { u32::from(f16::from_f32(x[src]).to_bits()) } else { x[src].to_bits() };
                        assert_eq!(got, want, "f16 {f16_cache}: token {t} head {h} dim {d}");
                    }
                }
            }
        }
    }
}

/// quantize_q8.wgsl writes the CPU engine's blocks bit for bit (int8 values, d, s, the integer
/// sum), from plain and from swizzled rows; values include a zero block and exact ties (x.5 steps).
#[test]
fn wgpu_quantize_q8_equals_the_cpu_blocks() {
    let _gpu = gpu_lock();
    let Some(ctx) = context() else { return eprintln!("skipped: no wgpu adapter") };
    let gpu = WgpuBackend::new(ctx);
    let (n, cols) = (3, 96);
    let nc = cols / 32;
    let mut x: Vec<f32> = uniform(31, n * cols).iter().map(|v| v * 3.0).collect();
    x[32..64].fill(0.0);
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5 * 127.0 / 16.0 / 8.0; // amax 127/16: steps of exactly 0.5 * i
    }
    let mut swz = vec![0f32; x.len()];
    for (t, row) in x.chunks_exact(cols).enumerate() {
        for (e, &v) in row.iter().enumerate() {
            let (c, k, i) = (e / 32, (e % 32) / 4, e % 4);
            swz[t * cols + 4 * (k * nc + c) + i] = v;
        }
    }
    for (swizzled, input) in [(false, &x), (true, &swz)] {
        let got = gpu.quantize_q8(input, n, cols, swizzled).expect("quantize");
        for (t, row) in x.chunks_exact(cols).enumerate() {
            let mut want = vec![crate::backend::cpu::quant::BlockQ8::default(); nc];
            crate::backend::cpu::quant::quantize_q8(row, &mut want);
            let w = &got[t * 3 * nc * 4..(t + 1) * 3 * nc * 4];
            for (b, blk) in want.iter().enumerate() {
                let qs: Vec<i8> = w[8 * b..8 * b + 8].iter().flat_map(|u| u.to_le_bytes()).map(|v| v as i8).collect();
                assert_eq!(qs, blk.qs, "swizzled {swizzled}: token {t} block {b} values");
                let sums = &w[4 * (2 * nc + b)..4 * (2 * nc + b) + 3];
                let isum: i32 = blk.qs.iter().map(|&q| i32::from(q)).sum();
                assert_eq!(sums, [blk.d.to_bits(), blk.s.to_bits(), isum as u32], "swizzled {swizzled}: token {t} block {b} d, s, sum");
            }
        }
    }
}

#[test]
fn wgpu_kernels_are_batch_invariant() {
    let _gpu = gpu_lock();
    if contexts().is_empty() {
        return eprintln!("skipped: no wgpu adapter");
    }
    for ctx in contexts() {
        batch_invariance_on(WgpuBackend::new(ctx.clone()));
    }
}

fn batch_invariance_on(gpu: WgpuBackend) {
    let (rows, cols, n) = (29, 256, 13);
    let x = uniform(14, n * cols);
    for ty in WEIGHT_TYPES {
        let data = weights(ty, rows, cols, 15);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let mut batch = vec![0f32; n * rows];
        gpu.try_matmul(w, &x, n, &mut batch).expect("matmul");
        // Alone, and in a batch that puts the token in another slot of the 8-token tile.
        for t in 0..n {
            let mut one = vec![0f32; rows];
            gpu.try_matmul(w, &x[t * cols..(t + 1) * cols], 1, &mut one).expect("matmul");
            assert!(one.iter().zip(&batch[t * rows..]).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: token {t} alone");
        }
        let mut part = vec![0f32; 5 * rows];
        gpu.try_matmul(w, &x[3 * cols..8 * cols], 5, &mut part).expect("matmul");
        assert!(part.iter().zip(&batch[3 * rows..8 * rows]).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: tokens 3..8");
    }
    // across 1024 keys (tg128@d1024's depth)
    let (n_head, n_kv, hd, cap) = (4, 2, 64, 1100);
    let (k, v) = (f16s(16, n_kv * cap * hd), f16s(17, n_kv * cap * hd));
    let positions: Vec<u32> = (1000..1040).collect();
    let q = uniform(18, positions.len() * n_head * hd);
    let batch = attention(&gpu, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
    let wdt = n_head * hd;
    for (t, p) in positions.iter().enumerate() {
        let one = attention(&gpu, &q[t * wdt..(t + 1) * wdt], &k, &v, cap, &[*p], (n_head, n_kv, hd));
        // A GPU error would have made the trait method fall back to the CPU: report it as such.
        if let Some(e) = gpu.take_error() {
            panic!("attention token {t}: GPU error {e}");
        }
        assert!(one.iter().zip(&batch[t * wdt..]).all(|(a, c)| a.to_bits() == c.to_bits()), "attention token {t}");
    }
    assert!(gpu.take_error().is_none());
}

/// Runs `hidden` through a fresh runner in chunks of the given sizes; returns the outputs.
fn run_chunks(ctx: &Arc<WgpuContext>, model: &crate::engine::Model, layers: std::ops::Range<usize>, kv: KvPrecision, hidden: &[f32], chunks: &[usize]) -> Vec<f32> {
    run_chunks_in(ctx, model, layers, kv, hidden, chunks, 64)
}

/// [`run_chunks`] with a cache of `capacity` positions.
fn run_chunks_in(
    ctx: &Arc<WgpuContext>,
    model: &crate::engine::Model,
    layers: std::ops::Range<usize>,
    kv: KvPrecision,
    hidden: &[f32],
    chunks: &[usize],
    capacity: usize,
) -> Vec<f32> {
    let e = model.config.n_embd;
    let batch = chunks.iter().copied().max().unwrap_or(0).max(16);
    let mut l = WgpuLayers::with_kv(ctx.clone(), model, layers, batch, capacity, kv).expect("layers");
    let mut out = hidden.to_vec();
    let mut at = 0;
    for &c in chunks {
        let pos: Vec<u32> = (at as u32..(at + c) as u32).collect();
        l.forward(&mut out[at * e..(at + c) * e], &pos).expect("forward");
        at += c;
    }
    assert_eq!(l.len(), at);
    out
}

#[test]
fn wgpu_layers_decode_equals_prefill_bitwise() {
    let _gpu = gpu_lock();
    if contexts().is_empty() {
        return eprintln!("skipped: no wgpu adapter");
    }
    for ctx in contexts() {
        decode_equals_prefill_on(ctx);
    }
}

fn decode_equals_prefill_on(ctx: &Arc<WgpuContext>) {
    // Q4_0: the Q8 matmuls; F16: f32 activations (with the second context's folded norm / silu)
    for ty in [GgmlType::Q4_0, GgmlType::F16] {
        decode_equals_prefill_of(ctx, ty);
    }
}

fn decode_equals_prefill_of(ctx: &Arc<WgpuContext>, ty: GgmlType) {
    let f = tempfile::NamedTempFile::new().expect("tmp");
    write_synth_model(&tiny_shape(), ty, 3, None, f.path(), |_| {}).expect("synth");
    let model = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
    let (n, e) = (13, model.config.n_embd);
    let hidden = uniform(19, n * e);
    for kv in [KvPrecision::F16, KvPrecision::F32] {
        for layers in [0..1, 0..2] {
            let prefill = run_chunks(ctx, &model, layers.clone(), kv, &hidden, &[n]);
            assert!(prefill.iter().all(|v| v.is_finite()) && prefill != hidden);
            for chunks in [vec![1; n], vec![5, 8], vec![9, 1, 3]] {
                let other = run_chunks(ctx, &model, layers.clone(), kv, &hidden, &chunks);
                assert!(
                    other.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kv:?} layers {layers:?}: chunks {chunks:?} differ from one prefill"
                );
            }
        }
        // Decoded positions 31..=40 (attention_one; tile 0, then tile 1 of group 1) equal the
        // prefill's (rope_store + attention); tiny_shape has GQA (4 query heads, 2 KV heads).
        let long = uniform(23, 41 * e);
        let prefill = run_chunks(ctx, &model, 0..2, kv, &long, &[16, 16, 9]);
        let decoded = run_chunks(ctx, &model, 0..2, kv, &long, &[16, 15, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert!(decoded.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "{kv:?}: decode past 32 positions");
        // Truncating and recomputing the tail reproduces it.
        let mut l = WgpuLayers::with_kv(ctx.clone(), &model, 0..2, 16, 64, kv).expect("layers");
        let pos: Vec<u32> = (0..n as u32).collect();
        let mut all = hidden.clone();
        l.forward(&mut all, &pos).expect("forward");
        l.truncate(7);
        let mut tail = hidden[7 * e..].to_vec();
        l.forward(&mut tail, &pos[7..]).expect("forward");
        assert!(tail.iter().zip(&all[7 * e..]).all(|(a, b)| a.to_bits() == b.to_bits()), "{kv:?}: after truncate");
        assert!(matches!(l.forward(&mut tail[..e], &[3]), Err(super::WgpuError::BadPositions { .. })));
    }
}

/// The wide tile (matmul_wide.wgsl) and the narrow one (matmul_tile.wgsl) against the one-token
/// kernels, bitwise, on rows of 1280 and 1408 columns (40 and 44 chunks: lanes of one and of two
/// chunks), the matrices of 768 rows and more in the wide tile (row tiles partial) and the
/// others in the narrow one, 36 tokens (two token tiles, the second partial) in one prefill
/// against 36 one-token steps, for the three repacked types: with `tile_wide` 1 (every step
/// wide), 0 (the narrow tile alone) and 20 (the choice by batch size: chunks of 12 and 24 tokens,
/// one narrow and one wide, give the bits of the whole prefill and of decode), every matrix size
/// allowed (`tile_wide_cols`).
#[test]
fn wgpu_wide_tile_decode_equals_prefill() {
    let _gpu = gpu_lock();
    if context().is_none() {
        return eprintln!("skipped: no wgpu adapter");
    }
    let shape = crate::gguf::synth::SynthShape { n_embd: 1280, n_layer: 1, n_head: 20, n_head_kv: 4, n_ff: 1408, ..tiny_shape() };
    let n = 36;
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        write_synth_model(&shape, ty, 11, None, f.path(), |_| {}).expect("synth");
        let model = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
        let hidden = uniform(37, n * model.config.n_embd);
        let mut outs = Vec::new();
        for from in [1, 0, 20] {
            let o = WgpuOptions { matmul_lanes: Some(32), decode_kernels: Some(DecodePlan::Unfused), tile_wide: from, tile_wide_cols: usize::MAX, ..test_options() };
            let ctx = WgpuContext::new(o).expect("adapter");
            assert_eq!(ctx.tile_wide, from);
            assert_eq!(ctx.kernels.matmul_wide.is_empty(), from == 0);
            let prefill = run_chunks(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &[n]);
            let decoded = run_chunks(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &[1; 36]);
            assert!(prefill.iter().all(|v| v.is_finite()) && prefill != hidden);
            assert!(decoded.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?} wide from {from}: prefill differs from decode");
            if from == 20 {
                let mixed = run_chunks(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &[12, 24]);
                assert!(mixed.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: chunks of 12 (narrow) and 24 (wide) differ");
            }
            outs.push(prefill);
        }
        for o in &outs[1..] {
            assert!(outs[0].iter().zip(o).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: wide and narrow tiles differ");
        }
    }
}

/// Where the adapter has tensor cores (`WgpuOptions::coop`), Q4_0 rows of 1280 and 1472 columns
/// (10 and 11.5 ranges of `coop::K_RANGE`: more than matvec_coop.wgsl's subgroups, so two rounds
/// with spare ranges, and a last range shorter than the others): a 36-token prefill in the small
/// tile (`coop_wide` 0), in the large one (1), in chunks of 12 and 24, and 36 one-token steps,
/// bitwise.
#[test]
fn wgpu_coop_decode_equals_prefill_across_ranges() {
    let _gpu = gpu_lock();
    let Some(first) = context() else { return eprintln!("skipped: no wgpu adapter") };
    if !first.coop_offered() {
        return eprintln!("skipped: {:?} has no cooperative matrices", first.adapter());
    }
    let (kr, sg) = (super::coop::K_RANGE as usize, super::coop::ONE_TOKEN_SUBGROUPS as usize);
    assert!(1280 / kr > sg && 1472 % kr != 0, "the shape no longer spans two rounds and a short range");
    let shape = crate::gguf::synth::SynthShape { n_embd: 1280, n_layer: 1, n_head: 20, n_head_kv: 4, n_ff: 1472, ..tiny_shape() };
    let n = 36;
    let f = tempfile::NamedTempFile::new().expect("tmp");
    write_synth_model(&shape, GgmlType::Q4_0, 11, None, f.path(), |_| {}).expect("synth");
    let model = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
    let hidden = uniform(37, n * model.config.n_embd);
    let mut reference: Option<Vec<f32>> = None;
    for coop_wide in [0, 1] {
        let ctx = WgpuContext::new(WgpuOptions { coop: true, coop_wide, ..test_options() }).expect("adapter");
        assert!(ctx.coop(), "offered, yet not built");
        let prefill = run_chunks(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &[n]);
        assert!(prefill.iter().all(|v| v.is_finite()) && prefill != hidden);
        for chunks in [vec![1; n], vec![12, 24]] {
            let out = run_chunks(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &chunks);
            assert!(out.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "coop_wide {coop_wide}: chunks {:?} differ from the prefill", &chunks[..2]);
        }
        if let Some(r) = &reference {
            assert!(r.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "the two tiles differ");
        }
        reference = Some(prefill);
    }
}

/// The default choice of tile (wide from `WIDE_FROM_TOKENS` tokens on matrices of fewer than
/// `WIDE_MAX_COLS` columns) on a SmolLM2-like layer (576 columns; q|k|v 960 and gate|up 3072
/// rows wide, o and down narrow), Q4_1 and Q4_0: a 260-token prefill (wide), one of 4 + 256
/// tokens (narrow, then wide) and 260 one-token steps, bitwise.
#[test]
fn wgpu_wide_tile_default_rule_decode_equals_prefill() {
    let _gpu = gpu_lock();
    if context().is_none() {
        return eprintln!("skipped: no wgpu adapter");
    }
    let shape = crate::gguf::synth::SynthShape { n_embd: 576, n_layer: 1, n_head: 9, n_head_kv: 3, n_ff: 1536, context: 512, ..tiny_shape() };
    let n = 260;
    assert!(n >= super::options::WIDE_FROM_TOKENS && 576 < super::options::WIDE_MAX_COLS && n - 4 >= super::options::WIDE_FROM_TOKENS);
    let o = WgpuOptions { matmul_lanes: Some(32), decode_kernels: Some(DecodePlan::Unfused), ..test_options() };
    let ctx = WgpuContext::new(o).expect("adapter");
    assert!(!ctx.kernels.matmul_wide.is_empty());
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0] {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        write_synth_model(&shape, ty, 13, None, f.path(), |_| {}).expect("synth");
        let model = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
        let hidden = uniform(41, n * model.config.n_embd);
        let prefill = run_chunks_in(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &[n], n);
        assert!(prefill.iter().all(|v| v.is_finite()) && prefill != hidden);
        for chunks in [vec![4, n - 4], vec![1; n]] {
            let out = run_chunks_in(&ctx, &model, 0..1, KvPrecision::F16, &hidden, &chunks, n);
            assert!(out.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "{ty:?}: chunks of {} tokens differ from the prefill", chunks[0]);
        }
    }
}

/// Decode past one chunk of 256 keys (attention split over chunks, one workgroup per head and
/// chunk, then attention_merge.wgsl, or on tiny_shape's Q8 model with the one-token kernels the
/// o projection folding the partials itself, `WgpuOptions::o_merge`, on and off) equals the
/// prefill (one workgroup per head and token walking the chunks), on tiny_shape and on the
/// synthetic Gemma 3 (sliding window 8: the decoded tokens' windows skip chunk 0 from position
/// 263 on). Positions 262..=269 are decoded.
#[test]
fn wgpu_split_attention_decode_equals_prefill() {
    use crate::gguf::synth::{SynthArch, SynthShape};
    let _gpu = gpu_lock();
    if contexts().is_empty() {
        return eprintln!("skipped: no wgpu adapter");
    }
    let dir = tempfile::tempdir().expect("tmp");
    for (name, shape) in [("tiny", SynthShape { context: 512, ..tiny_shape() }), ("gemma3", SynthShape::small(SynthArch::Gemma3))] {
        let path = dir.path().join(format!("{name}.gguf"));
        write_synth_model(&shape, GgmlType::Q8_0, 3, None, &path, |_| {}).expect("synth");
        let model = crate::engine::Model::load(&path, Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
        let (n, e, nl) = (270, model.config.n_embd, model.config.n_layer);
        let hidden = uniform(31, n * e);
        let mut prefill_chunks = vec![16; n / 16];
        prefill_chunks.push(n % 16);
        let mut decode_chunks = vec![16; 16];
        decode_chunks.extend([6]);
        decode_chunks.extend([1; 8]);
        // the default context, and on tiny the 32-lane ones (one-token kernels: o + merge, and
        // attention_one's own split path) and one without o_merge
        let ctxs = contexts();
        let mut pick: Vec<Arc<WgpuContext>> = ctxs.iter().enumerate().filter(|(i, _)| *i == 0 || name == "tiny").map(|(_, c)| c.clone()).collect();
        if name == "tiny" && ctxs.len() > 1 {
            let o = WgpuOptions { matmul_lanes: Some(32), decode_kernels: Some(DecodePlan::Unfused), o_merge: false, ..test_options() };
            pick.push(WgpuContext::new(o).expect("context without o_merge"));
        }
        for ctx in &pick {
            assert!(ctx.attention_split);
            let prefill = run_chunks_in(ctx, &model, 0..nl, KvPrecision::F16, &hidden, &prefill_chunks, 300);
            assert!(prefill.iter().all(|v| v.is_finite()));
            let decoded = run_chunks_in(ctx, &model, 0..nl, KvPrecision::F16, &hidden, &decode_chunks, 300);
            assert!(decoded.iter().zip(&prefill).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: split decode past 256 keys differs from the prefill");
        }
    }
}

/// Every option documented "same bits" (`WgpuOptions::bit_neutral_variants`), flipped one at a
/// time from the GPUs' default plan (32 lanes, one-token kernels on), leaves the layer runner's
/// output bitwise as it was: prefill, then one-token steps (the first one recorded as it goes,
/// in parts of `submit_layers`, the next ones recorded ahead), on a Q8 model and an f32-activation
/// one (where the folded decode kernels apply); where the adapter has tensor cores, again with
/// Q4_0 on them (`coop`: the 9-token prefill in the small tile, or in the large one with
/// `coop_wide` 1).
#[test]
fn bit_neutral_options_keep_the_bits() {
    let _gpu = gpu_lock();
    let base = WgpuOptions { matmul_lanes: Some(32), ..test_options() };
    let Some(first) = contexts().first() else { return eprintln!("skipped: no wgpu adapter") };
    // and with Q4_0 on tensor cores where the adapter has them (`coop_wide` then changes tiles)
    let coop = first.coop_offered().then_some(WgpuOptions { coop: true, ..base });
    for base in [Some(base), coop].into_iter().flatten() {
        options_keep_the_bits(base);
    }
}

fn options_keep_the_bits(base: WgpuOptions) {
    let ctx_of = |o: WgpuOptions| match WgpuContext::new(o) {
        Ok(c) => Some(c),
        Err(e) if e.is_unavailable() => None,
        Err(e) => panic!("wgpu context {o:?}: {e}"),
    };
    let variants = base.bit_neutral_variants();
    let Some(first) = ctx_of(variants[1].1) else { return eprintln!("skipped: no wgpu adapter") };
    let ctxs: Vec<(&str, Arc<WgpuContext>)> =
        variants.iter().map(|(name, o)| (*name, if *o == variants[1].1 { first.clone() } else { ctx_of(*o).expect("adapter") })).collect();
    for ty in [GgmlType::Q4_0, GgmlType::F16] {
        let f = tempfile::NamedTempFile::new().expect("tmp");
        write_synth_model(&tiny_shape(), ty, 7, None, f.path(), |_| {}).expect("synth");
        let model = crate::engine::Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
        let e = model.config.n_embd;
        let hidden = uniform(29, 14 * e);
        let chunks = [9, 1, 1, 1, 1, 1];
        let reference = run_chunks(&first, &model, 0..2, KvPrecision::F16, &hidden, &chunks);
        for (name, ctx) in &ctxs {
            let out = run_chunks(ctx, &model, 0..2, KvPrecision::F16, &hidden, &chunks);
            let same = out.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{ty:?}: option {name:?} ({}, tensor cores {}) changed the bits", ctx.decode_kernels(), ctx.coop());
        }
    }
}

/// A variable source holding `pairs` (the environment as `WgpuOptions::from_vars` reads it).
fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[test]
fn options_from_the_environment() {
    assert_eq!(WgpuOptions::from_vars(vars(&[])).expect("none"), WgpuOptions::default());
    let o = WgpuOptions::from_vars(vars(&[
        ("FORGE_WGPU_MATMUL_LANES", "64"),
        ("FORGE_WGPU_DECODE", "shared"),
        ("FORGE_WGPU_ATTN_ONE", "1"),
        ("FORGE_WGPU_ATTN_SPLIT", "0"),
        ("FORGE_WGPU_O_MERGE", "0"),
        ("FORGE_WGPU_ATTN_KV", "64"),
        ("FORGE_WGPU_Q8", "0"),
        ("FORGE_WGPU_TILE", "0"),
        ("FORGE_WGPU_TILE_WIDE", "1"),
        ("FORGE_WGPU_TILE_WIDE_COLS", "2048"),
        ("FORGE_WGPU_STAGE", "0"),
        ("FORGE_WGPU_QKV_ROPE", "0"),
        ("FORGE_WGPU_SUBMIT_LAYERS", "6"),
        ("FORGE_WGPU_SPIN_US", "0"),
        ("FORGE_WGPU_SHADER_CHECKS", "1"),
        ("FORGE_WGPU_COOP", "0"),
        ("FORGE_WGPU_COOP_WIDE", "128"),
    ]))
    .expect("all set");
    let want = WgpuOptions {
        allow_software: false,
        matmul_lanes: Some(64),
        decode_kernels: Some(DecodePlan::Fused),
        attention_one: true,
        attention_split: false,
        o_merge: false,
        attention_kv: 64,
        q8: false,
        tile: false,
        tile_wide: 1,
        tile_wide_cols: 2048,
        stage: false,
        qkv_rope: false,
        subgroups: false,
        submit_layers: 6,
        spin_us: 0,
        shader_checks: true,
        coop: false,
        coop_wide: 128,
    };
    assert_eq!(o, want);
    for (k, v) in [("FORGE_WGPU_Q8", "no"), ("FORGE_WGPU_DECODE", "fast"), ("FORGE_WGPU_SPIN_US", "-1"), ("FORGE_WGPU_ATTN_KV", "all")] {
        let e = WgpuOptions::from_vars(vars(&[(k, v)])).expect_err("bad value");
        assert!(e.to_string().contains(k), "{e}");
    }
}

/// With `WgpuOptions::coop`, where an adapter offers cooperative matrices (16 x 16 x 16, f16
/// in, f32 out), Q4_0 runs on them: matmul_coop.wgsl compiled. A driver that offers them and
/// fails to compile the kernel only logs a warning (the integer path serves), so a GPU machine
/// sets `FORGE_EXPECT_COOP` to make that a failure (the H200's NVIDIA Vulkan driver offers
/// them; lavapipe does not). Without the option, never.
#[test]
fn coop_matmuls_compile_where_offered() {
    let _gpu = gpu_lock();
    let Some(plain) = context() else { return eprintln!("skipped: no wgpu adapter") };
    assert!(!plain.coop(), "coop off by default, yet the kernels were built");
    let on = WgpuContext::new(WgpuOptions { coop: true, ..test_options() }).expect("adapter");
    eprintln!("{:?}: offers tensor cores: {}, Q4_0 on them: {}", on.adapter(), on.coop_offered(), on.coop());
    assert!(on.coop_offered() || !on.coop(), "built where not offered");
    if std::env::var_os("FORGE_EXPECT_COOP").is_some() {
        assert!(on.coop(), "FORGE_EXPECT_COOP is set, but {:?} runs no cooperative-matrix matmul", on.adapter());
    }
}

#[test]
fn detection_never_fails() {
    let _gpu = gpu_lock();
    // Without software adapters this machine may have none: that is `None`, not a panic.
    let hw = WgpuContext::detect(WgpuOptions::default());
    eprintln!("hardware adapter: {:?}", hw.as_ref().map(|c| c.adapter().clone()));
    if let Some(c) = hw {
        assert!(!c.is_software());
    }
}

/// The subgroup-shuffle kernels (mv_main_sg.wgsl, mt_main_sg.wgsl) compile wherever an
/// adapter offers SUBGROUP, also where its subgroups are not 32 wide and the context keeps the
/// workgroup-memory trees (lavapipe: 8), so that a shader error shows up without a GPU.
#[test]
fn subgroup_kernels_compile_where_offered() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let Some(adapter) = adapters.into_iter().find(|a| a.features().contains(wgpu::Features::SUBGROUP)) else {
        return eprintln!("skipped: no adapter offers subgroups");
    };
    let (device, _queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: wgpu::Features::SUBGROUP,
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .expect("device");
    let k = super::context::build_kernels(&device, 32, DecodePlan::Fused, true, Some(false), false).expect("kernels");
    assert!(!k.matmul_tile.is_empty() && !k.matvec.is_empty());
    let k = super::context::build_kernels(&device, 32, DecodePlan::Off, false, Some(true), false).expect("wide kernels");
    assert!(!k.matmul_wide.is_empty());
}

/// attention_kv.wgsl (one workgroup per KV head and block of tokens) gives `attention`'s bits
/// (one workgroup per query head and token), and the CPU's values within `attention`'s
/// tolerance (2e-5, backend/tests.rs): 3, 8, 1 and 16 query heads per KV head (blocks of 4, 2, 16
/// and 1 tokens), head_dim 64, 128 and 40 (an 8-element tail, pairs past the head idle), with and
/// without a sliding window, a prefill from 0, one across the chunk edge at 256, and positions
/// out of order with the last key of the cache.
#[test]
fn wgpu_attention_kv_equals_attention() {
    use crate::backend::Backend;
    let _gpu = gpu_lock();
    let ctx_of = |from: usize| WgpuContext::new(WgpuOptions { attention_kv: from, ..test_options() });
    let (grouped, plain) = match (ctx_of(1), ctx_of(0)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) if e.is_unavailable() => return eprintln!("skipped: {e}"),
        (Err(e), _) | (_, Err(e)) => panic!("wgpu context: {e}"),
    };
    if grouped.kernels.attention_kv.is_none() {
        return eprintln!("skipped: less than 24 KiB of workgroup memory");
    }
    let (kv_gpu, gpu, cpu) = (WgpuBackend::new(grouped), WgpuBackend::new(plain), CpuBackend::new(1).expect("pool"));
    let cap = 600;
    let run = |b: &dyn Backend, q: &[f32], k: &[f16], v: &[f16], pos: &[u32], heads: (usize, usize, usize), window: Option<usize>| {
        let (n_head, n_kv_head, head_dim) = heads;
        let mut out = vec![f32::NAN; q.len()];
        b.attention(crate::backend::AttentionArgs { q, k_cache: k, v_cache: v, capacity: cap, positions: pos, n_head, n_kv_head, head_dim, window, out: &mut out });
        out
    };
    let scattered = vec![511u32, 3, 260, 259, 40, 599, 0, 255, 256, 100, 101, 102, 103, 104, 105, 106, 107];
    for heads in [(9, 3, 64), (8, 1, 64), (4, 4, 128), (6, 2, 40), (16, 1, 64)] {
        let (n_head, n_kv, hd) = heads;
        let (k, v) = (f16s(41, n_kv * cap * hd), f16s(42, n_kv * cap * hd));
        for window in [None, Some(100)] {
            for positions in [(0..37).collect::<Vec<u32>>(), (230..290).collect(), scattered.clone()] {
                let q = uniform(43, positions.len() * n_head * hd);
                let a = run(&kv_gpu, &q, &k, &v, &positions, heads, window);
                let b = run(&gpu, &q, &k, &v, &positions, heads, window);
                let what = format!("heads {heads:?} window {window:?} positions {:?}..", &positions[..2]);
                for g in [&kv_gpu, &gpu] {
                    if let Some(e) = g.take_error() {
                        panic!("{what}: GPU error {e}");
                    }
                }
                assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{what}: attention_kv differs from attention");
                let r = run(&cpu, &q, &k, &v, &positions, heads, window);
                for (i, (x, y)) in a.iter().zip(&r).enumerate() {
                    assert!((x - y).abs() <= 2e-5, "{what} [{i}]: {x} vs the CPU's {y}");
                }
            }
        }
    }
}
