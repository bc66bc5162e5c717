//! AMX tile kernels against the scalar reference, bitwise, at every tile split. They need a CPU
//! with AMX-INT8 (and Linux's tile permission): elsewhere they print why and pass.

use super::*;
use crate::backend::cpu::quant::{dot_q8_scalar, dot_q8k_scalar, quantize_q8, quantize_q8k, BlockQ8};
use crate::backend::cpu::testutil::{rand_f32, rand_row};
use crate::backend::cpu::{x16, x16k, x16q};
use crate::backend::simd::amx_status;
use crate::backend::WeightView;
use crate::gguf::{GgmlType, QK, QK_K};

fn amx_or_skip(test: &str) -> bool {
    match amx_status() {
        Ok(_) => true,
        Err(why) => {
            eprintln!("{test}: skipped, AMX not usable here: {why}");
            false
        }
    }
}

/// Token counts: one tile; two tiles and a tail of 5 (8 → 4 → 1 on the x16 kernel); below a tile;
/// three tiles.
const N_TOK: [usize; 4] = [16, 37, 7, 48];

/// Runs `f(rows, out)` over two row ranges (the split must not matter) and checks every (token,
/// row) against `want(t, r)` bitwise.
fn check(name: &str, rows: usize, n_tok: usize, f: impl Fn(Range<usize>, &SharedOut), want: impl Fn(usize, usize) -> f32) {
    let mut o = vec![f32::NAN; n_tok * rows];
    let out = SharedOut::new(&mut o, rows);
    f(0..16, &out);
    f(16..rows, &out);
    for t in 0..n_tok {
        for r in 0..rows {
            assert_eq!(o[t * rows + r].to_bits(), want(t, r).to_bits(), "{name} {n_tok} tokens: token {t} row {r}");
        }
    }
}

/// A 32-element type's tiles (`packed` repacks a view, `rest` is its x16 kernel) against the
/// scalar reference at every token count of [`N_TOK`]; 20, 9 and 3 blocks per row (an odd
/// block after the pairs), a last group of 5 rows.
fn legacy_tiles_equal_reference<B: AmxBlock<Act = BlockQ8O>>(ty: GgmlType, packed: fn(&WeightView<'_>) -> Packed16<B>, rest: RestKernel<B>) {
    for (rows, cols) in [(48, 640), (64, 288), (32, 96), (37, 96)] {
        let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(ty, cols, 300 + r as u64)).collect();
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let p = packed(&w);
        let nb = cols / QK;
        for n_tok in N_TOK {
            let x = rand_f32(7 + n_tok as u64, n_tok * cols);
            let mut q8 = vec![BlockQ8::default(); n_tok * nb];
            let mut q8o = vec![BlockQ8O::default(); n_tok * nb];
            for t in 0..n_tok {
                quantize_q8(&x[t * cols..(t + 1) * cols], &mut q8[t * nb..(t + 1) * nb]);
                // SAFETY: AMX is usable (the callers check), which includes the AVX-512 level.
                unsafe { x16::quantize_q8o(&x[t * cols..(t + 1) * cols], &mut q8o[t * nb..(t + 1) * nb]) };
            }
            check(
                &format!("{ty:?} {rows}x{cols}"),
                rows,
                n_tok,
                // SAFETY: AMX usable (the callers check).
                |r, out| unsafe { matmul_rows(&p, r, &q8o, n_tok, out, rest) },
                |t, r| dot_q8_scalar(ty, w.row(r), &q8[t * nb..(t + 1) * nb]),
            );
        }
    }
}

#[test]
fn q5_0_tiles_equal_reference_bitwise() {
    if !amx_or_skip("q5_0_tiles_equal_reference_bitwise") {
        return;
    }
    legacy_tiles_equal_reference(GgmlType::Q5_0, x16::PackedQ5x16::new, x16::matmul_rows_q5_0);
}

/// The `x16q` types: Q4_0 (the 1.1B), Q4_1 (SmolLM2, two accumulators), Q8_0 (its output head).
#[test]
fn x16q_tiles_equal_reference_bitwise() {
    if !amx_or_skip("x16q_tiles_equal_reference_bitwise") {
        return;
    }
    legacy_tiles_equal_reference(GgmlType::Q4_0, x16q::PackedQ40x16::new, x16q::matmul_rows_q4_0);
    legacy_tiles_equal_reference(GgmlType::Q4_1, x16q::PackedQ41x16::new, x16q::matmul_rows_q4_1);
    legacy_tiles_equal_reference(GgmlType::Q8_0, x16q::PackedQ80x16::new, x16q::matmul_rows_q8_0);
}

#[test]
fn k_quant_tiles_equal_reference_bitwise() {
    if !amx_or_skip("k_quant_tiles_equal_reference_bitwise") {
        return;
    }
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        // 3 blocks per row (a pair, then one), and a single block
        for (rows, cols) in [(48, 768), (32, 256)] {
            let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(ty, cols, 500 + r as u64)).collect();
            let w = WeightView::new(ty, rows, cols, &data).expect("view");
            let nb = cols / QK_K;
            let p4 = x16k::PackedQ4Kx16::fits(&w).then(|| x16k::PackedQ4Kx16::new(&w));
            let p6 = x16k::PackedQ6Kx16::fits(&w).then(|| x16k::PackedQ6Kx16::new(&w));
            for n_tok in N_TOK {
                let x = rand_f32(9 + n_tok as u64, n_tok * cols);
                let mut q8k = vec![BlockQ8K::default(); n_tok * nb];
                for t in 0..n_tok {
                    quantize_q8k(&x[t * cols..(t + 1) * cols], &mut q8k[t * nb..(t + 1) * nb]);
                }
                check(
                    &format!("{ty:?} {rows}x{cols}"),
                    rows,
                    n_tok,
                    // SAFETY: AMX usable (checked above).
                    |r, out| unsafe {
                        match (&p4, &p6) {
                            (Some(p), _) => matmul_rows(p, r, &q8k, n_tok, out, x16k::matmul_rows_q4k),
                            (_, Some(p)) => matmul_rows(p, r, &q8k, n_tok, out, x16k::matmul_rows_q6k),
                            _ => unreachable!("one of the two fits"),
                        }
                    },
                    |t, r| dot_q8k_scalar(ty, w.row(r), &q8k[t * nb..(t + 1) * nb]),
                );
            }
        }
    }
}

/// The tile configuration's bytes are where LDTILECFG reads them (runs everywhere).
#[test]
fn tile_config_layout() {
    let c = TileCfg::new(32);
    assert_eq!(std::mem::size_of::<TileCfg>(), 64);
    let b = &c as *const TileCfg as *const u8;
    // SAFETY: reads inside the 64-byte struct.
    let byte = |i: usize| unsafe { *b.add(i) };
    assert_eq!(byte(0), 1, "palette");
    assert_eq!((byte(16), byte(17)), (32, 0), "tmm0 colsb");
    assert_eq!((byte(18), byte(19)), (64, 0), "tmm1 colsb");
    assert_eq!((byte(48), byte(49), byte(50), byte(53)), (16, 8, 16, 16), "rows of tmm0, tmm1, tmm2, tmm5");
    assert_eq!(byte(54), 0, "tmm6 unused");
}

/// Not a check: prints tile kernels against the x16 kernels, one thread, a 2048 × 2048 matrix
/// and 512 tokens (`cargo test --release --lib amx_speed -- --ignored --nocapture`).
#[test]
#[ignore]
fn amx_speed() {
    if !amx_or_skip("amx_speed") {
        return;
    }
    let (rows, cols, n_tok) = (2048, 2048, 512);
    let x = rand_f32(3, n_tok * cols);
    let time = |name: &str, f: &dyn Fn(Range<usize>, &SharedOut)| {
        let mut o = vec![0f32; n_tok * rows];
        let out = SharedOut::new(&mut o, rows);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            f(0..rows, &out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        eprintln!("{name}: {:.1} ms, {:.0} GMAC/s", best * 1e3, (rows * cols * n_tok) as f64 / best / 1e9);
    };
    let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(GgmlType::Q5_0, cols, r as u64)).collect();
    let p = x16::PackedQ5x16::new(&WeightView::new(GgmlType::Q5_0, rows, cols, &data).expect("view"));
    let nb = cols / QK;
    let mut q8o = vec![BlockQ8O::default(); n_tok * nb];
    // SAFETY: AMX is usable, which includes the AVX-512 level.
    unsafe { x16::quantize_q8o(&x, &mut q8o) };
    // SAFETY: as above.
    time("Q5_0 x16", &|r, o| unsafe { x16::matmul_rows_q5_0(&p, r, &q8o, n_tok, o) });
    // SAFETY: as above.
    time("Q5_0 amx", &|r, o| unsafe { matmul_rows(&p, r, &q8o, n_tok, o, x16::matmul_rows_q5_0) });
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(ty, cols, r as u64)).collect();
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        match ty {
            GgmlType::Q4_0 => {
                let p = x16q::PackedQ40x16::new(&w);
                // SAFETY: as above.
                time("Q4_0 x16", &|r, o| unsafe { x16q::matmul_rows_q4_0(&p, r, &q8o, n_tok, o) });
                // SAFETY: as above.
                time("Q4_0 amx", &|r, o| unsafe { matmul_rows(&p, r, &q8o, n_tok, o, x16q::matmul_rows_q4_0) });
            }
            GgmlType::Q4_1 => {
                let p = x16q::PackedQ41x16::new(&w);
                // SAFETY: as above.
                time("Q4_1 x16", &|r, o| unsafe { x16q::matmul_rows_q4_1(&p, r, &q8o, n_tok, o) });
                // SAFETY: as above.
                time("Q4_1 amx", &|r, o| unsafe { matmul_rows(&p, r, &q8o, n_tok, o, x16q::matmul_rows_q4_1) });
            }
            _ => {
                let p = x16q::PackedQ80x16::new(&w);
                // SAFETY: as above.
                time("Q8_0 x16", &|r, o| unsafe { x16q::matmul_rows_q8_0(&p, r, &q8o, n_tok, o) });
                // SAFETY: as above.
                time("Q8_0 amx", &|r, o| unsafe { matmul_rows(&p, r, &q8o, n_tok, o, x16q::matmul_rows_q8_0) });
            }
        }
    }
    let nb = cols / QK_K;
    let mut q8k = vec![BlockQ8K::default(); n_tok * nb];
    quantize_q8k(&x, &mut q8k);
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        let data: Vec<u8> = (0..rows).flat_map(|r| rand_row(ty, cols, r as u64)).collect();
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        if ty == GgmlType::Q4K {
            let p = x16k::PackedQ4Kx16::new(&w);
            // SAFETY: as above.
            time("Q4_K x16", &|r, o| unsafe { x16k::matmul_rows_q4k(&p, r, &q8k, n_tok, o) });
            // SAFETY: as above.
            time("Q4_K amx", &|r, o| unsafe { matmul_rows(&p, r, &q8k, n_tok, o, x16k::matmul_rows_q4k) });
        } else {
            let p = x16k::PackedQ6Kx16::new(&w);
            // SAFETY: as above.
            time("Q6_K x16", &|r, o| unsafe { x16k::matmul_rows_q6k(&p, r, &q8k, n_tok, o) });
            // SAFETY: as above.
            time("Q6_K amx", &|r, o| unsafe { matmul_rows(&p, r, &q8k, n_tok, o, x16k::matmul_rows_q6k) });
        }
    }
}
