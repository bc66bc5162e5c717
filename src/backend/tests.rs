//! Every kernel against the CPU's scalar reference: one test body per op, run on every backend
//! present (candle's `test_device!`): the CPU's scalar reference first, its SIMD level, wgpu on
//! each test context (`wgpu::tests::contexts`: software adapters allowed, so lavapipe in CI), and
//! HIP on each matmul tile (skipped, with the reason, without a HIP device). Backend-only checks
//! (exact dequantization, batch invariance, the layer runners) are in `wgpu/tests.rs` and
//! `hip/tests.rs`, with the reasoning behind each tolerance in their module docs:
//! * matmul: wgpu `matmul_tolerance` (f32 activations against the CPU's q8); HIP the float
//!   summation order alone (`4e-5 · Σ|w·x| + 1e-6`: it quantizes activations as the CPU does) plus,
//!   for Q4_K / Q6_K, twice `amax_b / 254 · Σ_b|w|` per 256-block; both GPUs also against the exact
//!   product of the dequantized weights, so a dequantization bug cannot hide in an allowance.
//! * RMSNorm `2e-5 · |ref| + 1e-7`; RoPE `2.4e-7 · (|x0| + |x1|)`, bitwise on HIP; attention `2e-5`;
//!   SiLU·mul `2e-6 · |ref| + 1e-7`; residual add bitwise; embedding lookup bitwise (the GPUs
//!   against `dequantize_row`, the CPU's own table read).
//! * Gemma 3's parts (the CPU and wgpu; HIP has none of them yet): NeoX RoPE as RoPE; GeGLU
//!   `4e-6 · |ref| + 2e-7` (wgpu forms tanh through exp: g / (1 + exp(-2u)), exp ≤ 5 ulp and the
//!   division 2.5 ulp against the CPU's tanh; the CPU's SIMD tanh is a rational approximation, see
//!   cpu/tests.rs); sliding-window attention as attention; the per-head q/k RMSNorm (rows of
//!   head_dim 256 with a weight of 256) as RMSNorm.

use std::sync::Arc;

use half::f16;

use super::cpu::{CpuBackend, SimdLevel};
use super::hip::{HipBackend, HipContext, Tile};
use super::wgpu::tests::{contexts, f16s, gpu_lock, uniform, weights};
use super::wgpu::{WgpuBackend, WEIGHT_TYPES};
use super::{AttentionArgs, Backend, WeightView};
use crate::backend::cpu::ops::rope_table;
use crate::gguf::{dequantize_row, GgmlType, QK, QK_K};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cpu,
    Wgpu,
    Hip,
}

/// A GPU backend's embedding lookup (not a `Backend` trait method: the CPU reads the table itself).
type Embed = Box<dyn Fn(WeightView<'_>, &[u32], &mut [f32]) -> Result<(), String>>;

struct Present {
    name: String,
    kind: Kind,
    backend: Arc<dyn Backend>,
    /// the GPU error a trait method fell back from, if any
    error: Box<dyn Fn() -> Option<String>>,
    /// the GPU's embedding lookup (None on the CPU)
    embed: Option<Embed>,
}

/// The HIP device, or None with the reason printed (`FORGE_HIP_REQUIRED`: a failure instead).
pub(crate) fn hip_context() -> Option<Arc<HipContext>> {
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

/// Every backend on this machine, the CPU scalar reference first.
fn backends() -> Vec<Present> {
    let cpu = |s| -> Present {
        let b = Arc::new(CpuBackend::with_simd(2, s).expect("pool"));
        Present { name: b.name(), kind: Kind::Cpu, backend: b, error: Box::new(|| None), embed: None }
    };
    let mut v = vec![cpu(SimdLevel::Scalar)];
    if SimdLevel::detect() != SimdLevel::Scalar {
        v.push(cpu(SimdLevel::detect()));
    }
    for ctx in contexts() {
        let w = Arc::new(WgpuBackend::new(ctx.clone()));
        let (e, m) = (w.clone(), w.clone());
        let embed: Embed = Box::new(move |t, ids, out| m.embed(t, ids, out).map_err(|e| e.to_string()));
        v.push(Present { name: w.name(), kind: Kind::Wgpu, backend: w, error: Box::new(move || e.take_error().map(|e| e.to_string())), embed: Some(embed) });
    }
    if contexts().is_empty() {
        eprintln!("(no wgpu adapter: the wgpu part of this test is skipped)");
    }
    if let Some(ctx) = hip_context() {
        for tile in [None, Some(Tile::T1), Some(Tile::T4), Some(Tile::T8), Some(Tile::T16), Some(Tile::Mma), Some(Tile::Mma64)] {
            let h = Arc::new(HipBackend::new(ctx.clone()).with_tile(tile));
            let (e, m) = (h.clone(), h.clone());
            let embed: Embed = Box::new(move |t, ids, out| m.embed(t, ids, out).map_err(|e| e.to_string()));
            v.push(Present { name: h.name(), kind: Kind::Hip, backend: h, error: Box::new(move || e.take_error().map(|e| e.to_string())), embed: Some(embed) });
        }
    }
    v
}

fn no_gpu_errors(all: &[Present]) {
    for p in all {
        if let Some(e) = (p.error)() {
            panic!("{}: GPU error: {e}", p.name);
        }
    }
}

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

/// wgpu's (and the CPU SIMD levels') allowed difference from the scalar reference for one output
/// (`wgpu/tests.rs` explains each term).
fn matmul_tolerance(ty: GgmlType, w: &[f32], wbytes: &[u8], x: &[f32]) -> f64 {
    let abs: f64 = w.iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
    let block = |n: usize, e: f64, m: &dyn Fn(usize) -> f64| -> f64 {
        (0..w.len() / n)
            .map(|b| {
                let r = b * n..(b + 1) * n;
                let amax = x[r.clone()].iter().fold(0f64, |a, v| a.max(v.abs() as f64));
                let wsum: f64 = w[r].iter().map(|v| v.abs() as f64).sum();
                amax * e * (wsum + 65.0 * m(b))
            })
            .sum()
    };
    let q8 = 1.0 / 254.0 + 2f64.powi(-11);
    let quant = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => block(QK, q8, &|_| 0.0),
        GgmlType::Q4_1 => block(QK, q8, &|b| f16::from_le_bytes([wbytes[20 * b + 2], wbytes[20 * b + 3]]).to_f64().abs()),
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => block(QK_K, 1.0 / 254.0, &|_| 0.0),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 0.0,
        other => unreachable!("{} has no GPU kernel (not in WEIGHT_TYPES)", other.name()),
    };
    4e-5 * abs + 1e-6 + quant * 1.001
}

/// Whether backend `p` has kernels for `ty` (the HIP tier lacks some of wgpu's types; its layers
/// refuse them by name, `backend/hip/layers.rs`).
fn has_kernel(p: &Present, ty: GgmlType) -> bool {
    !matches!(p.kind, Kind::Hip) || crate::backend::hip::kernels::type_info(ty).is_some()
}

#[test]
fn matmul_every_type_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    for ty in WEIGHT_TYPES {
        let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let k_quant = matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K);
        // 1024 columns: several items per HIP lane; small shapes: partial tiles and few blocks
        let shapes: &[(usize, usize, usize)] = match (float, k_quant) {
            (true, _) => &[(37, 1024, 11), (9, 72, 3)],
            (_, true) => &[(37, 1024, 11), (5, 256, 1)],
            _ => &[(37, 1024, 11), (9, 96, 3)],
        };
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
            for p in all.iter().filter(|p| has_kernel(p, ty)) {
                let mut out = vec![f32::NAN; n_tok * rows];
                p.backend.matmul(w, &x, n_tok, &mut out);
                for t in 0..n_tok {
                    for r in 0..rows {
                        let (wr, xt) = (&wf[r * cols..(r + 1) * cols], &x[t * cols..(t + 1) * cols]);
                        let (got, want) = (out[t * rows + r], reference[t * rows + r]);
                        let sum_order = 4e-5 * wr.iter().zip(xt).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum::<f64>() + 1e-6;
                        let tol = match p.kind {
                            Kind::Hip => sum_order + if k_quant { 2.0 * block_bound(wr, xt, QK_K, 1.0 / 254.0) } else { 0.0 },
                            _ => matmul_tolerance(ty, wr, w.row(r), xt),
                        };
                        assert!(((got - want) as f64).abs() <= tol, "{} {ty:?} {rows}x{cols} [t {t}, r {r}]: {got} vs reference {want} (tol {tol:e})", p.name);
                        let q8 = if float { 0.0 } else { block_bound(wr, xt, QK, 1.0 / 254.0 + 2f64.powi(-11)) * 1.001 };
                        let exact_tol = match p.kind {
                            Kind::Cpu => continue,
                            Kind::Wgpu => sum_order,
                            Kind::Hip => sum_order + q8,
                        };
                        let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                        assert!((got as f64 - exact).abs() <= exact_tol, "{} {ty:?} [t {t}, r {r}]: {got} vs exact {exact}", p.name);
                    }
                }
            }
        }
    }
    no_gpu_errors(&all);
}

#[test]
fn rmsnorm_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    // 2600: several workgroups / CTAs per row, the last one partial
    // 256: Gemma 3's per-head q/k norm (n_tok · n_head rows of head_dim)
    for (dim, n) in [(576, 5), (2600, 3), (256, 12)] {
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
    no_gpu_errors(&all);
}

#[test]
fn rope_on_every_backend() {
    let _gpu = gpu_lock();
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
            // HIP rounds each product as the CPU does: bitwise
            let tol = if p.kind == Kind::Hip { 0.0 } else { 2.4e-7 * (x0[pair].abs() + x0[pair + 1].abs()) };
            assert!((a - r).abs() <= tol, "{} [{i}]: {a} vs {r}", p.name);
        }
    }
    no_gpu_errors(&all);
}

#[test]
fn rope_neox_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    // Gemma 3's head (256, all dims rotated), and a partial rotation (Phi-3-like rope_dims < head_dim)
    for (n_head, hd, rope_dims) in [(3, 256, 256), (2, 64, 32)] {
        let table = rope_table(300, hd, rope_dims, 10000.0);
        let positions: Vec<u32> = vec![0, 1, 7, 128, 299];
        let x0 = uniform(14, positions.len() * n_head * hd);
        let mut reference = x0.clone();
        all[0].backend.rope_neox(&mut reference, &positions, n_head, hd, rope_dims, &table);
        assert_ne!(reference, x0, "the reference rotates");
        for p in all.iter().filter(|p| p.kind != Kind::Hip) {
            let mut x = x0.clone();
            p.backend.rope_neox(&mut x, &positions, n_head, hd, rope_dims, &table);
            for (i, (a, r)) in x.iter().zip(&reference).enumerate() {
                // the element's pair partner: half the rotated span away (none past rope_dims)
                let d = i % hd;
                let partner = if d >= rope_dims { i } else if d < rope_dims / 2 { i + rope_dims / 2 } else { i - rope_dims / 2 };
                let tol = 2.4e-7 * (x0[i].abs() + x0[partner].abs());
                assert!((a - r).abs() <= tol, "{} hd {hd} rope_dims {rope_dims} [{i}]: {a} vs {r}", p.name);
            }
        }
    }
    no_gpu_errors(&all);
}

#[test]
fn sliding_window_attention_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    let (cap, heads) = (300, (4, 1, 64));
    let (k, v) = (f16s(15, cap * 64), f16s(16, cap * 64));
    // windows inside one tile, across tile edges, of one key, and longer than the context
    for window in [50usize, 1, 100, 512] {
        for positions in [vec![299u32], (120..140).collect::<Vec<u32>>(), vec![0], vec![33]] {
            let q = uniform(17, positions.len() * 4 * 64);
            let run = |b: &dyn Backend| {
                let mut out = vec![f32::NAN; q.len()];
                b.attention(AttentionArgs { q: &q, k_cache: &k, v_cache: &v, capacity: cap, positions: &positions, n_head: heads.0, n_kv_head: heads.1, head_dim: heads.2, window: Some(window), out: &mut out });
                out
            };
            let reference = run(&*all[0].backend);
            if window < 100 && positions[0] > 100 {
                let full = attention(&*all[0].backend, &q, &k, &v, cap, &positions, heads);
                assert!(full.iter().zip(&reference).any(|(a, b)| (a - b).abs() > 1e-3), "the window changes the result");
            }
            for p in all.iter().filter(|p| p.kind != Kind::Hip) {
                let out = run(&*p.backend);
                for (i, (a, r)) in out.iter().zip(&reference).enumerate() {
                    assert!((a - r).abs() <= 2e-5, "{} window {window} positions {:?} [{i}]: {a} vs {r}", p.name, &positions[..1]);
                }
            }
        }
    }
    no_gpu_errors(&all);
}

#[test]
fn gelu_tanh_mul_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    // [-6, 6): the GELU's curved part and both tails
    let g0: Vec<f32> = uniform(18, 2000).iter().map(|v| 6.0 * v).collect();
    let u = uniform(19, 2000);
    let mut reference = g0.clone();
    all[0].backend.gelu_tanh_mul(&mut reference, &u);
    for p in all.iter().filter(|p| p.kind != Kind::Hip) {
        let mut g = g0.clone();
        p.backend.gelu_tanh_mul(&mut g, &u);
        for (i, (a, r)) in g.iter().zip(&reference).enumerate() {
            assert!((a - r).abs() <= 4e-6 * r.abs() + 2e-7, "{} gelu_tanh_mul [{i}] g {}: {a} vs {r}", p.name, g0[i]);
        }
    }
    no_gpu_errors(&all);
}

/// Attention through `b` over caches `k`, `v` ([n_kv, cap, hd] f16) for queries at `pos`.
pub(crate) fn attention(b: &dyn Backend, q: &[f32], k: &[f16], v: &[f16], cap: usize, pos: &[u32], heads: (usize, usize, usize)) -> Vec<f32> {
    let (n_head, n_kv_head, head_dim) = heads;
    let mut out = vec![f32::NAN; q.len()];
    b.attention(AttentionArgs { q, k_cache: k, v_cache: v, capacity: cap, positions: pos, n_head, n_kv_head, head_dim, window: None, out: &mut out });
    out
}

#[test]
fn attention_on_every_backend() {
    let _gpu = gpu_lock();
    let all = backends();
    let cap = 1100;
    for (n_head, n_kv, hd) in [(4, 2, 64), (2, 1, 128), (8, 2, 32)] {
        let (k, v) = (f16s(5, n_kv * cap * hd), f16s(6, n_kv * cap * hd));
        // decode-like (one late position), prefill-like (a run crossing tile edges), position 0,
        // and the same two past 1024 keys (tg128@d1024's depth, where a kernel that splits the
        // keys into rounds or chunks of 1024 has its first edge)
        for positions in [vec![299u32], (120..140).collect::<Vec<u32>>(), vec![0], vec![1090], (1015..1030).collect()] {
            let q = uniform(7, positions.len() * n_head * hd);
            let reference = attention(&*all[0].backend, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
            for p in all.iter().filter(|p| hd == 64 || p.kind != Kind::Wgpu) {
                let out = attention(&*p.backend, &q, &k, &v, cap, &positions, (n_head, n_kv, hd));
                for (i, (a, r)) in out.iter().zip(&reference).enumerate() {
                    assert!((a - r).abs() <= 2e-5, "{} hd {hd} positions {:?} [{i}]: {a} vs {r}", p.name, &positions[..1]);
                }
            }
        }
    }
    no_gpu_errors(&all);
}

#[test]
fn silu_mul_and_add_on_every_backend() {
    let _gpu = gpu_lock();
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
    no_gpu_errors(&all);
}

#[test]
fn embedding_is_exact_dequantization_on_every_gpu() {
    let _gpu = gpu_lock();
    let all = backends();
    let (rows, cols) = (50, 512);
    let ids = [0u32, 49, 7, 7, 23];
    for ty in WEIGHT_TYPES {
        let data = weights(ty, rows, cols, 11);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        for p in all.iter().filter(|p| has_kernel(p, ty)) {
            let Some(embed) = &p.embed else { continue };
            let mut out = vec![f32::NAN; ids.len() * cols];
            embed(w, &ids, &mut out).unwrap_or_else(|e| panic!("{} {ty:?}: embed: {e}", p.name));
            for (t, &id) in ids.iter().enumerate() {
                let mut want = vec![0f32; cols];
                dequantize_row(ty, w.row(id as usize), &mut want);
                let got = &out[t * cols..(t + 1) * cols];
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{} {ty:?}: row {id} differs from dequantize_row", p.name);
            }
        }
    }
    no_gpu_errors(&all);
}
