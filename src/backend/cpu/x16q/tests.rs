//! The repacked Q4_0 / Q4_1 / Q8_0 kernels against the scalar reference, bitwise.

use super::*;
use crate::backend::cpu::blocks::BlockQ8O;
use crate::backend::cpu::quant::{dot_q8_scalar, quantize_q8, BlockQ8};
use crate::backend::cpu::shared::SharedOut;
use crate::backend::cpu::testutil::{rand_f32, rand_row};
use crate::backend::cpu::x16::quantize_q8o;
use crate::backend::cpu::SimdLevel;
use crate::backend::WeightView;
use crate::gguf::dequantize_row;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

fn matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows).flat_map(|r| rand_row(ty, cols, 700 + r as u64)).collect()
}

/// Row l of a repacked block: its 32 weights as the dequantizer gives them.
fn values(ty: GgmlType, p: &[u8], l: usize) -> [f32; 32] {
    let h = |at: usize| half::f16::from_le_bytes([p[at + 2 * l], p[at + 2 * l + 1]]).to_f32();
    let nib = |e: usize| {
        let byte = p[64 * ((e % 16) / 4) + 4 * l + e % 4];
        (if e < 16 { byte & 0xF } else { byte >> 4 }) as f32
    };
    std::array::from_fn(|e| match ty {
        GgmlType::Q4_0 => h(256) * (nib(e) - 8.0),
        GgmlType::Q4_1 => h(256) * nib(e) + h(288),
        _ => h(512) * ((p[64 * (e / 4) + 4 * l + e % 4] ^ 0x80) as i8) as f32,
    })
}

/// The repacked blocks hold exactly the mapped rows' values and scales, and are as big as the
/// tensor (rows rounded up to 16).
#[test]
fn repack_keeps_every_value() {
    for ty in TYPES {
        let (rows, cols) = (37, 96);
        let data = matrix(ty, rows, cols);
        let w = WeightView::new(ty, rows, cols, &data).expect("view");
        let (nb, bytes, blk): (usize, usize, Vec<Vec<u8>>) = {
            fn raw<B: Block16>(p: &Packed16<B>) -> (usize, Vec<Vec<u8>>) {
                let n = std::mem::size_of::<B>();
                // SAFETY: the blocks are plain `repr(C)` bytes and u16s without padding; the slice
                // covers exactly the vector's initialized elements.
                let bytes = unsafe { std::slice::from_raw_parts(p.blocks.as_ptr() as *const u8, p.bytes()) };
                (p.bytes(), bytes.chunks_exact(n).map(|c| c.to_vec()).collect())
            }
            let (b, v) = match ty {
                GgmlType::Q4_0 => raw(&PackedQ40x16::new(&w)),
                GgmlType::Q4_1 => raw(&PackedQ41x16::new(&w)),
                _ => raw(&PackedQ80x16::new(&w)),
            };
            (cols / QK, b, v)
        };
        assert_eq!(bytes, rows.div_ceil(ROWS) * ROWS * ty.block_bytes() * nb, "{ty:?}: the tensor's size");
        for r in 0..rows {
            let mut want = vec![0f32; cols];
            dequantize_row(ty, w.row(r), &mut want);
            for b in 0..nb {
                let got = values(ty, &blk[(r / ROWS) * nb + b], r % ROWS);
                for e in 0..QK {
                    assert_eq!(got[e].to_bits(), want[b * QK + e].to_bits(), "{ty:?} row {r} col {}", b * QK + e);
                }
            }
        }
    }
}

/// Each kernel equals the scalar reference bitwise for every token of every tile size (19
/// tokens: 8, 8, 1, 1, 1; 13: 8, 4, 1), odd block counts, and row counts that are not a multiple
/// of 16 (a padded last group, whose padding rows are never written).
#[test]
fn kernels_equal_reference_bitwise() {
    if !SimdLevel::Avx512Vnni.supported() {
        return;
    }
    for ty in TYPES {
        for (rows, cols, n_tok) in [(48, 640, 19), (16, 96, 13), (37, 32, 5), (8, 64, 9)] {
            let data = matrix(ty, rows, cols);
            let w = WeightView::new(ty, rows, cols, &data).expect("view");
            let nb = cols / QK;
            let mut x = rand_f32(11, n_tok * cols);
            x[..32].fill(0.0);
            let mut q8 = vec![BlockQ8::default(); n_tok * nb];
            let mut q8o = vec![BlockQ8O::default(); n_tok * nb];
            for t in 0..n_tok {
                quantize_q8(&x[t * cols..(t + 1) * cols], &mut q8[t * nb..(t + 1) * nb]);
                // SAFETY: AVX-512 VNNI support was checked above.
                unsafe { quantize_q8o(&x[t * cols..(t + 1) * cols], &mut q8o[t * nb..(t + 1) * nb]) };
            }
            // (a store of a padded group's padding rows would fail `SharedOut`'s bounds check)
            let mut o = vec![f32::NAN; n_tok * rows];
            let out = SharedOut::new(&mut o, rows);
            let (p0, p1, p8) = (PackedQ40x16::new, PackedQ41x16::new, PackedQ80x16::new);
            // two calls where there are two groups: the row split must not matter
            let splits = if rows > 16 { vec![0..16, 16..rows] } else { vec![0..rows] };
            for r in splits {
                // SAFETY: AVX-512 VNNI support was checked above.
                unsafe {
                    match ty {
                        GgmlType::Q4_0 => matmul_rows_q4_0(&p0(&w), r, &q8o, n_tok, &out),
                        GgmlType::Q4_1 => matmul_rows_q4_1(&p1(&w), r, &q8o, n_tok, &out),
                        _ => matmul_rows_q8_0(&p8(&w), r, &q8o, n_tok, &out),
                    }
                }
            }
            for t in 0..n_tok {
                for r in 0..rows {
                    let want = dot_q8_scalar(ty, w.row(r), &q8[t * nb..(t + 1) * nb]);
                    assert_eq!(o[t * rows + r].to_bits(), want.to_bits(), "{ty:?} {rows}x{cols} token {t} row {r}");
                }
            }
        }
    }
}
