//! Every SIMD kernel against the scalar reference, and batch invariance of the kernels
//! (a token's result is bitwise the same alone or inside a batch, whatever the thread count).

use half::f16;

use super::testutil::{rand_f32, rand_row};
use super::{ops, CpuBackend, SimdLevel};
use crate::backend::offload::FfnActivation;
use crate::backend::{AttentionArgs, Backend, WeightView};
use crate::gguf::GgmlType;

/// Every weight type the CPU runs.
const TYPES: [GgmlType; 15] = GgmlType::ALL;

fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|r| rand_row(ty, cols, 100 + r as u64)).collect()
}

/// Every kernel level this machine can run, the reference first.
fn backends(threads: usize) -> Vec<CpuBackend> {
    SimdLevel::available().into_iter().map(|l| CpuBackend::with_simd(threads, l).expect("pool")).collect()
}

/// Every type at `cols` columns, and the 32-block types at an odd block count (the AVX-512
/// kernels' lone last block).
fn shapes(cols: usize, odd_cols: usize) -> impl Iterator<Item = (GgmlType, usize)> {
    let odd = TYPES.into_iter().filter(|t| t.block_elems() == 32).map(move |t| (t, odd_cols));
    TYPES.map(|t| (t, cols)).into_iter().chain(odd)
}

/// Error budget of a SIMD matmul against the reference: both compute the same exact integer
/// block products; only the float accumulation differs (f32 rounding over ≤ 2 × cols / 32
/// terms), far below 1e-4 relative.
#[test]
fn simd_matmul_matches_reference() {
    // 14 tokens: a tile of 8 (AVX-512), one of 4, then 2 single tokens.
    let (rows, n_tok) = (37, 14);
    for (ty, cols) in shapes(512, 544) {
        let x = rand_f32(1, n_tok * cols);
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let outs: Vec<Vec<f32>> = backends(2)
            .iter()
            .map(|b| {
                let mut o = vec![0f32; n_tok * rows];
                b.matmul(w, &x, n_tok, &mut o);
                o
            })
            .collect();
        for o in &outs[1..] {
            for (i, (a, r)) in o.iter().zip(&outs[0]).enumerate() {
                // Same integer block products; only float summation order differs.
                let tol = 1e-4 * (1.0 + r.abs());
                assert!((a - r).abs() <= tol, "{ty:?} x {cols} [{i}]: simd {a} vs reference {r}");
            }
        }
    }
}

#[test]
fn matmul_is_batch_and_thread_invariant() {
    let rows = 29;
    for (ty, cols) in shapes(256, 288) {
        // 15 tokens: tiles of 8 and 4 (AVX-512), 4 (the others), and single tokens
        let n = 15;
        let x = rand_f32(2, n * cols);
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        for b1 in backends(1) {
            let b3 = CpuBackend::with_simd(3, b1.simd()).expect("pool");
            let mut batch = vec![0f32; n * rows];
            b3.matmul(w, &x, n, &mut batch);
            for t in 0..n {
                let mut one = vec![0f32; rows];
                b1.matmul(w, &x[t * cols..(t + 1) * cols], 1, &mut one);
                assert!(
                    one.iter().zip(&batch[t * rows..]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} {:?}: token {t} differs alone vs in a batch",
                    b1.simd()
                );
            }
        }
    }
}

fn kv(n: usize, seed: u64) -> Vec<f16> {
    rand_f32(seed, n).into_iter().map(f16::from_f32).collect()
}

#[test]
fn attention_simd_matches_reference_and_is_batch_invariant() {
    check_attention(300, (290..300).collect(), None, 64);
}

/// Contexts longer than one `ops::ATT_SEG` (512 keys): the x86 levels split them into segments
/// and merge; queries on both sides of the 512 and 1024 boundaries, alone and batched.
#[test]
fn long_context_attention_matches_reference_and_is_batch_invariant() {
    check_attention(1300, [0, 3, 510, 511, 512, 513, 700, 1023, 1024, 1025, 1299].into(), None, 64);
}

/// A prefill batch of consecutive positions (the AVX-512 level attends blocks of tokens
/// together) across tile (128), sub-tile and segment (512, 1024) edges: alone and batched equal.
#[test]
fn prefill_blocks_across_tile_and_segment_edges_match_reference() {
    check_attention(1100, (120..133).chain(500..530).chain(1019..1030).collect(), None, 64);
}

/// Sliding windows (Gemma's local layers): short windows inside one tile, a window of 600 that
/// spans segments, at head size 256 (Gemma 3); alone, batched, against the reference.
#[test]
fn sliding_window_attention_matches_reference_and_is_batch_invariant() {
    check_attention(1300, [0, 7, 8, 9, 300, 1299].into(), Some(8), 256);
    check_attention(1300, [0, 599, 600, 601, 1100, 1299].into(), Some(600), 64);
}

/// A window only hides keys: the output equals full attention over the window's keys alone.
#[test]
fn sliding_window_sees_exactly_its_keys() {
    let (hd, cap, w) = (64, 40, 8);
    let k = kv(cap * hd, 3);
    let v = kv(cap * hd, 4);
    let q = rand_f32(5, hd);
    for b in backends(1) {
        let run = |k: &[f16], v: &[f16], pos: u32, window| {
            let mut out = vec![0f32; hd];
            b.attention(AttentionArgs { q: &q, k_cache: k, v_cache: v, capacity: cap, positions: &[pos], n_head: 1, n_kv_head: 1, head_dim: hd, window, out: &mut out });
            out
        };
        let windowed = run(&k, &v, 30, Some(w));
        // The same keys moved to positions 0..8 of another cache, attended in full.
        let mut k2 = k.clone();
        let mut v2 = v.clone();
        k2.copy_within((31 - w) * hd..31 * hd, 0);
        v2.copy_within((31 - w) * hd..31 * hd, 0);
        let full = run(&k2, &v2, (w - 1) as u32, None);
        assert!(windowed.iter().zip(&full).all(|(a, c)| a.to_bits() == c.to_bits()), "{:?}", b.simd());
        assert_ne!(windowed, run(&k, &v, 30, None), "{:?}: the window changes the result", b.simd());
    }
}

fn check_attention(cap: usize, positions: Vec<u32>, window: Option<usize>, hd: usize) {
    let (n_head, n_kv) = (6, 2);
    let k = kv(n_kv * cap * hd, 3);
    let v = kv(n_kv * cap * hd, 4);
    let q = rand_f32(5, positions.len() * n_head * hd);
    let run = |b: &CpuBackend, q: &[f32], pos: &[u32]| {
        let mut out = vec![0f32; q.len()];
        b.attention(AttentionArgs {
            q,
            k_cache: &k,
            v_cache: &v,
            capacity: cap,
            positions: pos,
            n_head,
            n_kv_head: n_kv,
            head_dim: hd,
            window,
            out: &mut out,
        });
        out
    };
    let all = backends(2);
    let reference = run(&all[0], &q, &positions);
    for (b, b1) in all.iter().zip(backends(1)) {
        let batch = run(b, &q, &positions);
        // One thread or two: the same bits (work splits never change a token's reduction order).
        assert!(run(&b1, &q, &positions).iter().zip(&batch).all(|(a, c)| a.to_bits() == c.to_bits()), "{:?}: 1 vs 2 threads", b.simd());
        for (a, r) in batch.iter().zip(&reference) {
            assert!((a - r).abs() <= 1e-5, "{:?}: {a} vs {r}", b.simd());
        }
        let w = n_head * hd;
        for (t, p) in positions.iter().enumerate() {
            let one = run(b, &q[t * w..(t + 1) * w], &[*p]);
            assert!(one.iter().zip(&batch[t * w..]).all(|(a, c)| a.to_bits() == c.to_bits()), "token {t}");
        }
    }
}

/// The K-quant SIMD kernels compute the reference's integers and float formula: bitwise equal.
#[test]
fn k_quant_simd_equals_reference_bitwise() {
    let (rows, cols, n_tok) = (9, 768, 14); // token tiles of 8 and 4, then two single tokens
    let x = rand_f32(21, n_tok * cols);
    for ty in TYPES.into_iter().filter(|t| t.block_elems() == 256) {
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let outs: Vec<Vec<u32>> = backends(2)
            .iter()
            .map(|b| {
                let mut o = vec![0f32; n_tok * rows];
                b.matmul(w, &x, n_tok, &mut o);
                o.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        assert!(outs.iter().all(|o| o == &outs[0]), "{ty:?}: SIMD differs from the reference");
    }
}

/// The AVX-512 activation layout holds exactly the scalar quantizer's values.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_quantization_equals_scalar_bitwise() {
    use super::avx512::{quantize_pairs, PairQ8};
    use super::quant::{quantize_q8, BlockQ8};
    if !SimdLevel::Avx512Vnni.supported() {
        return;
    }
    for cols in [32, 288, 576, 1536] {
        let mut x = rand_f32(31, cols);
        x[..32].fill(0.0); // an all-zero block
        if cols > 40 {
            x[40] = 0.5 / 127.0 * 3.0; // values near rounding ties
        }
        let nb = cols / 32;
        let mut blocks = vec![BlockQ8::default(); nb];
        quantize_q8(&x, &mut blocks);
        let mut pairs = vec![PairQ8::default(); nb.div_ceil(2)];
        let mut simd_blocks = vec![BlockQ8::default(); nb];
        // SAFETY: AVX-512 VNNI support was checked above.
        unsafe {
            quantize_pairs(&x, &mut pairs);
            super::avx512::quantize_q8(&x, &mut simd_blocks);
        }
        for (b, (s, r)) in simd_blocks.iter().zip(&blocks).enumerate() {
            assert_eq!((s.d.to_bits(), s.s.to_bits(), s.qs), (r.d.to_bits(), r.s.to_bits(), r.qs), "block {b}");
        }
        for (b, blk) in blocks.iter().enumerate() {
            let (p, h) = (&pairs[b / 2], 16 * (b % 2));
            assert_eq!(&p.qs[h..h + 16], &blk.qs[..16], "block {b}");
            assert_eq!(&p.qs[32 + h..48 + h], &blk.qs[16..], "block {b}");
            assert_eq!((p.d[4 * (b % 2)].to_bits(), p.s[b % 2].to_bits()), (blk.d.to_bits(), blk.s.to_bits()), "block {b}");
        }
    }
}

/// The SIMD GELU (f64 with its own exp) against `ops::gelu`, over the range MiniLM sees and the
/// tails; every slice length gives the same value per element.
#[test]
fn gelu_simd_matches_reference() {
    let xs: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.0025).chain([-60.0, -12.0, -6.5, 0.0, -0.0, 6.5, 12.0, 60.0]).collect();
    for b in backends(1) {
        let mut y = xs.clone();
        b.gelu(&mut y);
        for (x, g) in xs.iter().zip(&y) {
            let r = ops::gelu(*x);
            assert!((g - r).abs() <= 1e-6 * r.abs().max(1e-3), "{:?}: gelu({x}) = {g}, reference {r}", b.simd());
        }
        for n in 1..8 {
            let mut t = xs[100..100 + n].to_vec();
            b.gelu(&mut t);
            assert!(t.iter().zip(&y[100..]).all(|(a, c)| a.to_bits() == c.to_bits()), "{:?}: length {n}", b.simd());
        }
    }
    // Split over a thread team (blocks of GELU_BLOCK): bitwise what one thread computes, at
    // lengths around the block boundaries.
    for (one, team) in backends(1).into_iter().zip(backends(3)) {
        for n in [4095, 4096, 4097, 6143, 8000, xs.len()] {
            let (mut a, mut c) = (xs[..n].to_vec(), xs[..n].to_vec());
            one.gelu(&mut a);
            team.gelu(&mut c);
            assert!(a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()), "{:?}: length {n}", one.simd());
        }
    }
}

/// One `matmul_multi` over matrices of different types (as Gemma's q|k|v: Q5_0, Q5_0, Q8_0)
/// computes exactly what separate matmuls do, on every level (the AVX-512 level feeds some of
/// them activation pairs and the others blocks in one call).
#[test]
fn mixed_type_matmul_multi_equals_separate_matmuls() {
    let (cols, n_tok) = (320, 5);
    let x = rand_f32(41, n_tok * cols);
    let mats: Vec<(GgmlType, usize, Vec<u8>)> = [(GgmlType::Q5_0, 24), (GgmlType::Q8_0, 8), (GgmlType::Q4_1, 16)]
        .into_iter()
        .map(|(ty, rows)| (ty, rows, matrix(ty, rows, cols)))
        .collect();
    for b in backends(2) {
        let views: Vec<WeightView<'_>> = mats.iter().map(|(ty, rows, d)| WeightView::new(*ty, *rows, cols, d).expect("view")).collect();
        let mut together: Vec<Vec<f32>> = views.iter().map(|w| vec![0f32; n_tok * w.rows]).collect();
        let mut outs: Vec<&mut [f32]> = together.iter_mut().map(|v| v.as_mut_slice()).collect();
        b.matmul_multi(&views, &x, n_tok, &mut outs);
        for (w, t) in views.iter().zip(&together) {
            let mut alone = vec![0f32; n_tok * w.rows];
            b.matmul(*w, &x, n_tok, &mut alone);
            assert!(alone.iter().zip(t).all(|(a, c)| a.to_bits() == c.to_bits()), "{:?} {:?}", b.simd(), w.ty);
        }
    }
}

/// The fused forms (`matmul_gated`: gate|up and the activation in one region; `matmul_add`: a
/// projection and its residual add) give exactly the bits of the separate calls, on every level,
/// with the repacked copies attached, in decode and in a batch, for 2 and 3 threads (home ranges
/// of uneven sizes, a padded last group of 16 rows).
#[test]
fn fused_gated_and_residual_equal_separate_calls() {
    let (rows, cols) = (40, 256);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4K, GgmlType::F32] {
        let (dg, du) = (matrix(ty, rows, cols), rand_row_matrix(ty, rows, cols));
        for threads in [2, 3] {
            for b in backends(threads) {
                let (g0, u0) = (WeightView::new(ty, rows, cols, &dg).expect("view"), WeightView::new(ty, rows, cols, &du).expect("view"));
                let (pg, pu) = (b.prepare(g0), b.prepare(u0));
                let (gw, uw) = (g0.with_prepared(pg.as_ref()), u0.with_prepared(pu.as_ref()));
                for n_tok in [1, 5] {
                    let x = rand_f32(7 + n_tok as u64, n_tok * cols);
                    for act in [FfnActivation::Silu, FfnActivation::GeluTanh] {
                        let (mut g1, mut u1) = (vec![0f32; n_tok * rows], vec![0f32; n_tok * rows]);
                        b.matmul_multi(&[gw, uw], &x, n_tok, &mut [&mut g1, &mut u1]);
                        match act {
                            FfnActivation::Silu => b.silu_mul(&mut g1, &u1),
                            FfnActivation::GeluTanh => b.gelu_tanh_mul(&mut g1, &u1),
                        }
                        let (mut g2, mut u2) = (vec![f32::NAN; n_tok * rows], vec![f32::NAN; n_tok * rows]);
                        b.matmul_gated(gw, uw, &x, n_tok, act, &mut g2, &mut u2);
                        assert!(g1.iter().zip(&g2).all(|(a, c)| a.to_bits() == c.to_bits()), "gated {ty:?} {:?} {act:?} {threads}t {n_tok} tok", b.simd());
                    }
                    // x += W·a, W [rows, cols] with rows = cols of the residual: a square slice of gw.
                    let a = rand_f32(11 + n_tok as u64, n_tok * cols);
                    let resid = rand_f32(13, n_tok * rows);
                    let (mut x1, mut p1) = (resid.clone(), vec![0f32; n_tok * rows]);
                    b.matmul(gw, &a, n_tok, &mut p1);
                    b.add(&mut x1, &p1);
                    let (mut x2, mut p2) = (resid.clone(), vec![f32::NAN; n_tok * rows]);
                    b.matmul_add(gw, &a, n_tok, &mut p2, &mut x2);
                    assert!(x1.iter().zip(&x2).all(|(a, c)| a.to_bits() == c.to_bits()), "residual {ty:?} {:?} {threads}t {n_tok} tok", b.simd());
                }
            }
        }
    }
}

/// A second matrix of other values (seeds apart from `matrix`'s).
fn rand_row_matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|r| rand_row(ty, cols, 9000 + r as u64)).collect()
}

/// The SIMD GeGLU (tanh GELU through e^x) against `ops::gelu_tanh`, over Gemma's range and the
/// tails; every slice length gives the same value per element.
#[test]
fn gelu_tanh_mul_simd_matches_reference() {
    let xs: Vec<f32> = (-3000..3000).map(|i| i as f32 * 0.004).chain([-60.0, -12.0, -9.5, 0.0, -0.0, 9.5, 12.0, 60.0, 1e-8, -1e-8]).collect();
    let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
    for b in backends(1) {
        let mut y = xs.clone();
        b.gelu_tanh_mul(&mut y, &up);
        for ((x, g), u) in xs.iter().zip(&y).zip(&up) {
            let r = ops::gelu_tanh(*x) * u;
            assert!((g - r).abs() <= 2e-6 * r.abs() + 1e-7 * u, "{:?}: gelu_tanh({x}) * {u} = {g}, reference {r}", b.simd());
        }
        for n in 1..10 {
            let mut t = xs[100..100 + n].to_vec();
            b.gelu_tanh_mul(&mut t, &up[100..]);
            assert!(t.iter().zip(&y[100..]).all(|(a, c)| a.to_bits() == c.to_bits()), "{:?}: length {n}", b.simd());
        }
    }
}

/// The AVX-512 Q8_K quantizer holds exactly the scalar quantizer's values: an all-zero block,
/// the largest magnitude twice with both signs (the first one's sign wins), rounding ties.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_q8k_quantization_equals_scalar_bitwise() {
    use super::quant::{quantize_q8k, BlockQ8K};
    if !SimdLevel::Avx512Vnni.supported() {
        return;
    }
    let mut x = rand_f32(33, 6 * 256);
    x[..256].fill(0.0);
    (x[300], x[400]) = (-9.0, 9.0);
    (x[600], x[601]) = (4.0, -4.0);
    for (i, v) in x[768..1024].iter_mut().enumerate() {
        // iscale = -127 / 127: every value i / 2 - 63.5 is a tie
        *v = if i == 255 { 127.0 } else { (i as f32 - 127.0) / 2.0 };
    }
    let mut want = vec![BlockQ8K::default(); 6];
    quantize_q8k(&x, &mut want);
    let mut got = vec![BlockQ8K::default(); 6];
    // SAFETY: AVX-512 VNNI support was checked above.
    unsafe { super::avx512_k::quantize_q8k(&x, &mut got) };
    for (b, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!((g.d.to_bits(), g.qs, g.bsums), (w.d.to_bits(), w.qs, w.bsums), "block {b}");
    }
}

/// The AVX-512 Q8_0 kernel (two rows per vector) equals the AVX2 kernel bitwise, at an odd row
/// count (a lone last row per chunk), alone and in token tiles, on 1 and 3 threads: greedy
/// outputs computed on either level are the same.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_q8_0_equals_avx2_bitwise() {
    if !SimdLevel::Avx512Vnni.supported() {
        return;
    }
    let (rows, cols, n_tok) = (41, 640, 6);
    let x = rand_f32(43, n_tok * cols);
    let data = matrix(GgmlType::Q8_0, rows, cols);
    let w = WeightView::new(GgmlType::Q8_0, rows, cols, &data).expect("view");
    let run = |level, threads, n: usize| {
        let mut o = vec![0f32; n * rows];
        CpuBackend::with_simd(threads, level).expect("pool").matmul(w, &x[..n * cols], n, &mut o);
        o.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
    };
    for (threads, n) in [(1, n_tok), (3, n_tok), (1, 1), (2, 4)] {
        assert_eq!(run(SimdLevel::Avx512Vnni, threads, n), run(SimdLevel::Avx2, threads, n), "{threads} threads, {n} tokens");
    }
}

/// A very tall matrix (as Gemma's 262k-row output projection) is split into longer chunks for a
/// single token than for a batch (`CpuBackend::row_chunk`); an odd chunk length leaves the
/// AVX-512 Q8_0 kernel lone rows at chunk ends. A token's logits are still bitwise the same
/// alone and in a batch, on every level.
#[test]
fn tall_matrix_decode_chunks_are_batch_invariant() {
    // 20100 rows / (2 threads * 64) = 157 rows per decode chunk
    let (rows, n) = (20100, 5);
    for (ty, cols) in [(GgmlType::Q8_0, 64), (GgmlType::Q5_0, 64), (GgmlType::Q4K, 256)] {
        let x = rand_f32(47, n * cols);
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        for b in backends(2) {
            let mut batch = vec![0f32; n * rows];
            b.matmul(w, &x, n, &mut batch);
            for t in 0..n {
                let mut one = vec![0f32; rows];
                b.matmul(w, &x[t * cols..(t + 1) * cols], 1, &mut one);
                assert!(one.iter().zip(&batch[t * rows..]).all(|(a, c)| a.to_bits() == c.to_bits()), "{ty:?} {:?}: token {t}", b.simd());
            }
        }
    }
}

/// RMSNorm of 8 rows at a time, and RoPE split over the team, give each row the one-row bits.
#[test]
fn norm_rows_and_parallel_rope_equal_one_row_at_a_time() {
    let d = 576;
    for n in [1usize, 7, 8, 9, 33, 70] {
        let x = rand_f32(5, n * d);
        let w = rand_f32(6, d);
        let mut got = vec![0f32; n * d];
        ops::rmsnorm_rows(&x, &w, 1e-5, &mut got);
        for (r, row) in got.chunks_exact(d).enumerate() {
            let mut want = vec![0f32; d];
            ops::rmsnorm(&x[r * d..(r + 1) * d], &w, 1e-5, &mut want);
            assert!(row.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rmsnorm row {r} of {n}");
        }
        let (hd, heads) = (64, 3);
        let cs = rand_f32(7, 100 * hd);
        let pos: Vec<u32> = (0..n as u32).map(|i| (i * 7) % 100).collect();
        let mut want = rand_f32(8, n * heads * hd);
        let mut par = want.clone();
        CpuBackend::with_simd(2, SimdLevel::Scalar).expect("pool").rope(&mut par, &pos, heads, hd, &cs);
        for (t, tok) in want.chunks_exact_mut(heads * hd).enumerate() {
            let p = pos[t] as usize;
            tok.chunks_exact_mut(hd).for_each(|h| ops::rope_head(h, &cs[p * hd..(p + 1) * hd]));
        }
        assert!(par.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "rope of {n} tokens");
    }
}

#[test]
fn dequantize_rows_equals_the_row_loop_on_any_team() {
    // 70 ids (runs of EMBED_ROWS and a short last run), repeats and the table's ends
    let (rows, cols) = (90, 256);
    let ids: Vec<u32> = (0..70u32).map(|i| (i * 37 + 5) % rows as u32).chain([0, rows as u32 - 1, 3, 3]).collect();
    for ty in TYPES {
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let mut want = vec![0f32; ids.len() * cols];
        for (o, &id) in want.chunks_exact_mut(cols).zip(&ids) {
            crate::gguf::dequantize_row(ty, w.row(id as usize), o);
        }
        for threads in [1, 3] {
            let b = CpuBackend::new(threads).expect("pool");
            let mut got = vec![f32::NAN; ids.len() * cols];
            b.dequantize_rows(w, &ids, &mut got);
            assert!(got.iter().zip(&want).all(|(a, r)| a.to_bits() == r.to_bits()), "{ty:?}, {threads} threads: rows differ");
        }
    }
}
