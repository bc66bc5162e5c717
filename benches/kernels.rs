//! Criterion benchmarks of the CPU kernels at every SIMD level this machine has, on SmolLM2-135M
//! shapes: matmul per weight type for decode (1 token) and prefill (64 tokens), and attention at
//! 1k and 4k keys. `cargo bench --bench kernels`; speed targets live in docs/perf.md, not here.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;

use forge_cache::backend::cpu::{CpuBackend, SimdLevel};
use forge_cache::backend::{AttentionArgs, Backend, WeightView};
use forge_cache::gguf::GgmlType;

fn rand_bytes(n: usize, mut s: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect()
}

/// Random blocks with small finite f16 scales at the block's scale offsets.
fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut b = rand_bytes(ty.row_bytes(cols).expect("blocks") * rows, 7);
    let scale = f16::from_f32(0.01).to_le_bytes();
    let offsets: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    if ty == GgmlType::F32 {
        for c in b.chunks_exact_mut(4) {
            c.copy_from_slice(&0.01f32.to_le_bytes());
        }
    } else if ty == GgmlType::F16 {
        for c in b.chunks_exact_mut(2) {
            c.copy_from_slice(&scale);
        }
    }
    for blk in b.chunks_exact_mut(ty.block_bytes()) {
        for &o in offsets {
            blk[o..o + 2].copy_from_slice(&scale);
        }
    }
    b
}

fn levels() -> Vec<CpuBackend> {
    let mut v: Vec<CpuBackend> = SimdLevel::available().into_iter().map(|l| CpuBackend::with_simd(1, l).expect("pool")).collect();
    if SimdLevel::detect() != SimdLevel::Scalar {
        v.push(CpuBackend::with_simd(2, SimdLevel::detect()).expect("pool"));
    }
    v
}

fn matmul(c: &mut Criterion) {
    let (rows, cols) = (1536, 576);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::F16, GgmlType::F32] {
        let cols = if ty.block_elems() == 256 { 512 } else { cols };
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let mut g = c.benchmark_group(format!("matmul_{}_{rows}x{cols}", ty.name()));
        for n_tok in [1usize, 64] {
            let x: Vec<f32> = (0..n_tok * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let mut out = vec![0f32; n_tok * rows];
            g.throughput(Throughput::Elements((rows * cols * n_tok) as u64));
            for b in levels() {
                if b.simd() == SimdLevel::Scalar && n_tok > 1 {
                    continue;
                }
                g.bench_with_input(BenchmarkId::new(b.name(), n_tok), &n_tok, |bn, &n| bn.iter(|| b.matmul(w, &x, n, &mut out)));
            }
        }
        g.finish();
    }
}

fn attention(c: &mut Criterion) {
    let (n_head, n_kv, hd) = (9, 3, 64);
    let mut g = c.benchmark_group("attention_decode");
    for depth in [1024usize, 4096] {
        let k: Vec<f16> = rand_bytes(n_kv * depth * hd, 3).iter().map(|&b| f16::from_f32(b as f32 / 255.0 - 0.5)).collect();
        let v = k.clone();
        let q: Vec<f32> = (0..n_head * hd).map(|i| (i as f32 * 0.1).sin()).collect();
        let mut out = vec![0f32; n_head * hd];
        for b in levels() {
            g.bench_with_input(BenchmarkId::new(b.name(), depth), &depth, |bn, &d| {
                bn.iter(|| {
                    b.attention(AttentionArgs {
                        q: &q,
                        k_cache: &k,
                        v_cache: &v,
                        capacity: d,
                        positions: &[(d - 1) as u32],
                        n_head,
                        n_kv_head: n_kv,
                        head_dim: hd,
                        window: None,
                        out: &mut out,
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = matmul, attention
}
criterion_main!(benches);
