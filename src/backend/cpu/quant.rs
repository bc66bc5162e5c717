//! Activation quantization and the scalar reference dot products of quantized weight rows.
//!
//! Activations are quantized once per token to an 8-bit block format so the inner loop of every
//! quantized matmul is integer multiply-add: [`BlockQ8`] (32 values) for the 32-element block
//! types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4), [`BlockQ8K`] (256 values) for K-quants. The integer part of each block product is
//! exact; only the float accumulation across blocks can differ between implementations.

use half::f16;

use super::shared::SharedOut;
use crate::backend::WeightView;
use crate::gguf::types::{e8m0_half, f16_at, q4k_scale_min, q5_high_bits, q5_pair, IQ4NL_VALUES, MXFP4_VALUES};
use crate::gguf::{GgmlType, QK, QK_K};

pub use super::blocks::{BlockQ8, BlockQ8K};

/// Which activation format a weight type's dot product consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// f32 activations, used as they are
    F32,
    Q8,
    Q8K,
}

pub fn act_format(ty: GgmlType) -> ActFormat {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActFormat::F32,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => ActFormat::Q8,
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => ActFormat::Q8K,
    }
}

/// Quantizes `x` (length a multiple of 32) into `out` (len x.len() / 32).
///
/// The same arithmetic as GGML's q8_0 / q8_1 activations (scale 127/amax, round half to even,
/// `d` and `s` rounded to f16), so integer block products equal llama.cpp's and our logits track
/// its reference outputs closely; the tiny SmolLM2 amplifies any rounding difference.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        *b = quantize_block_q8(xs);
    }
}

/// One block of [`quantize_q8`] (`xs`: 32 values).
#[inline]
pub fn quantize_block_q8(xs: &[f32]) -> BlockQ8 {
    let mut b = BlockQ8::default();
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in b.qs.iter_mut().zip(xs) {
        let r = (v * id).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    b.d = f16::from_f32(d).to_f32();
    b.s = f16::from_f32(d * sum as f32).to_f32();
    b
}

/// Quantizes `x` (length a multiple of 256) into `out` (len x.len() / 256) exactly as GGML's
/// `quantize_row_q8_K_ref`: the value of largest magnitude maps to -127 (so `d` carries its
/// sign), round half to even, sums per 16.
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xs {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (g, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}


/// Reference dot of one weight row of a 32-element block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// IQ4_NL, MXFP4) with a quantized activation row.
pub fn dot_q8_scalar(ty: GgmlType, w: &[u8], x: &[BlockQ8]) -> f32 {
    let bb = ty.block_bytes();
    let mut acc = 0f32;
    // Q4_1's min terms, summed apart as llama.cpp's x86 kernels do (see its arm)
    let mut acc_m = 0f32;
    for (wb, xb) in w.chunks_exact(bb).zip(x) {
        // MXFP4 has an E8M0 scale byte instead (read in its arm).
        let d = if ty == GgmlType::MXFP4 { 0.0 } else { f16_at(wb, 0) };
        acc += match ty {
            GgmlType::Q4_0 => {
                let qs = &wb[2..18];
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    sumi += ((qs[j] & 0x0F) as i32 - 8) * xb.qs[j] as i32;
                    sumi += ((qs[j] >> 4) as i32 - 8) * xb.qs[j + QK / 2] as i32;
                }
                d * xb.d * sumi as f32
            }
            GgmlType::Q4_1 => {
                let m = f16_at(wb, 2);
                let qs = &wb[4..20];
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    sumi += (qs[j] & 0x0F) as i32 * xb.qs[j] as i32;
                    sumi += (qs[j] >> 4) as i32 * xb.qs[j + QK / 2] as i32;
                }
                // llama.cpp's x86 form: fused (d·d_x)·sumi into one sum, fused m·s into another,
                // added at the end. SmolLM2 (Q4_1) follows llama.cpp's greedy tokens closely only
                // with this rounding; the unfused per-block `(d·d_x)·sumi + m·s` flips a confident
                // step of tests/reference_smollm2.rs.
                acc_m = m.mul_add(xb.s, acc_m);
                acc = (d * xb.d).mul_add(sumi as f32, acc);
                continue;
            }
            GgmlType::Q8_0 => {
                let mut sumi = 0i32;
                for j in 0..QK {
                    sumi += (wb[2 + j] as i8) as i32 * xb.qs[j] as i32;
                }
                d * xb.d * sumi as f32
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                // Q5_0: d, qh, qs (weights q - 16); Q5_1: d, m, qh, qs (weights q, plus m·s).
                let at = if ty == GgmlType::Q5_0 { 2 } else { 4 };
                let (qh, qs) = (q5_high_bits(wb, at), &wb[at + 4..at + 20]);
                let k = if ty == GgmlType::Q5_0 { 16 } else { 0 };
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    let (lo, hi) = q5_pair(qs[j], qh, j);
                    sumi += (lo as i32 - k) * xb.qs[j] as i32;
                    sumi += (hi as i32 - k) * xb.qs[j + QK / 2] as i32;
                }
                let min = if ty == GgmlType::Q5_1 { f16_at(wb, 2) * xb.s } else { 0.0 };
                d * xb.d * sumi as f32 + min
            }
            GgmlType::IQ4NL | GgmlType::MXFP4 => {
                let (table, d, qs) = match ty {
                    GgmlType::IQ4NL => (&IQ4NL_VALUES, d, &wb[2..18]),
                    _ => (&MXFP4_VALUES, e8m0_half(wb[0]), &wb[1..17]),
                };
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    sumi += table[(qs[j] & 0x0F) as usize] as i32 * xb.qs[j] as i32;
                    sumi += table[(qs[j] >> 4) as usize] as i32 * xb.qs[j + QK / 2] as i32;
                }
                d * xb.d * sumi as f32
            }
            _ => unreachable!("dot_q8_scalar called for {ty:?}"),
        };
    }
    if ty == GgmlType::Q4_1 {
        return acc + acc_m;
    }
    acc
}

/// Reference matmul rows (same contract as the SIMD `matmul_rows_q8`): rows `rows` of a Q4_0 /
/// Q4_1 / Q8_0 matrix against `n_tok` activation rows (`acts`: [n_tok, cols / 32]).
pub fn matmul_rows_q8_scalar(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
    let nb = w.cols / QK;
    for t in 0..n_tok {
        for r in rows.clone() {
            out.write(t, r, dot_q8_scalar(w.ty, w.row(r), &acts[t * nb..(t + 1) * nb]));
        }
    }
}

/// Reference dot of one K-quant weight row (Q2_K .. Q6_K) with a Q8_K activation row. Each
/// block's integer sums are exact; its float formula is the one every SIMD kernel repeats, so
/// they equal this bitwise.
pub fn dot_q8k_scalar(ty: GgmlType, w: &[u8], x: &[BlockQ8K]) -> f32 {
    let bb = ty.block_bytes();
    let mut acc = 0f32;
    for (wb, xb) in w.chunks_exact(bb).zip(x) {
        acc += match ty {
            GgmlType::Q4K => {
                let d = f16_at(wb, 0) * xb.d;
                let dmin = f16_at(wb, 2) * xb.d;
                let scales = &wb[4..16];
                let qs = &wb[16..144];
                let (mut sum_sc, mut sum_min) = (0i32, 0i32);
                for pair in 0..4 {
                    let q = &qs[32 * pair..32 * pair + 32];
                    for half in 0..2 {
                        let j = 2 * pair + half;
                        let (sc, m) = q4k_scale_min(j, scales);
                        let xs = &xb.qs[32 * j..32 * j + 32];
                        let mut sumi = 0i32;
                        for l in 0..32 {
                            let v = if half == 0 { q[l] & 0x0F } else { q[l] >> 4 };
                            sumi += v as i32 * xs[l] as i32;
                        }
                        sum_sc += sc as i32 * sumi;
                        sum_min += m as i32 * (xb.bsums[2 * j] as i32 + xb.bsums[2 * j + 1] as i32);
                    }
                }
                d * sum_sc as f32 - dmin * sum_min as f32
            }
            GgmlType::Q6K => {
                let d = f16_at(wb, 208) * xb.d;
                let mut sum = 0i32;
                for half in 0..2 {
                    let ql = &wb[64 * half..64 * half + 64];
                    let qh = &wb[128 + 32 * half..128 + 32 * half + 32];
                    let sc = &wb[192 + 8 * half..192 + 8 * half + 8];
                    let xs = &xb.qs[128 * half..128 * half + 128];
                    // Four groups of 32 (each two scale groups of 16), as in the dequantizer.
                    let mut grp = [[0i32; 2]; 4];
                    for l in 0..32 {
                        let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let is = l / 16;
                        grp[0][is] += q1 * xs[l] as i32;
                        grp[1][is] += q2 * xs[l + 32] as i32;
                        grp[2][is] += q3 * xs[l + 64] as i32;
                        grp[3][is] += q4 * xs[l + 96] as i32;
                    }
                    for (g, pair) in grp.iter().enumerate() {
                        for (is, s) in pair.iter().enumerate() {
                            sum += (sc[is + 2 * g] as i8) as i32 * s;
                        }
                    }
                }
                d * sum as f32
            }
            GgmlType::Q2K => super::quant_k::dot_q2k_block(wb, xb),
            GgmlType::Q3K => super::quant_k::dot_q3k_block(wb, xb),
            GgmlType::Q5K => super::quant_k::dot_q5k_block(wb, xb),
            _ => unreachable!("dot_q8k_scalar called for {ty:?}"),
        };
    }
    acc
}

/// Reference dot of an F32 / F16 / BF16 weight row with f32 activations.
pub fn dot_float_scalar(ty: GgmlType, w: &[u8], x: &[f32]) -> f32 {
    let mut acc = 0f32;
    match ty {
        GgmlType::F32 => {
            for (c, v) in w.chunks_exact(4).zip(x) {
                acc += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * v;
            }
        }
        GgmlType::F16 => {
            for (c, v) in w.chunks_exact(2).zip(x) {
                acc += f16::from_le_bytes([c[0], c[1]]).to_f32() * v;
            }
        }
        GgmlType::BF16 => {
            for (c, v) in w.chunks_exact(2).zip(x) {
                acc += half::bf16::from_le_bytes([c[0], c[1]]).to_f32() * v;
            }
        }
        _ => unreachable!("dot_float_scalar called for {ty:?}"),
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::testutil::{rand_f32, rand_row};
    use crate::gguf::dequantize_row;

    /// The quantized dots agree with dequantize-then-f64-dot within the activation rounding.
    #[test]
    fn quantized_dots_match_dequantized() {
        let cols = 512;
        let x = rand_f32(7, cols);
        for ty in GgmlType::ALL.into_iter().filter(|t| t.block_elems() > 1) {
            let w = rand_row(ty, cols, 3);
            let mut wf = vec![0f32; cols];
            dequantize_row(ty, &w, &mut wf);
            let exact: f64 = wf.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let norm: f64 = wf.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = match act_format(ty) {
                ActFormat::Q8 => {
                    let mut q = vec![BlockQ8::default(); cols / QK];
                    quantize_q8(&x, &mut q);
                    dot_q8_scalar(ty, &w, &q)
                }
                ActFormat::Q8K => {
                    let mut q = vec![BlockQ8K::default(); cols / QK_K];
                    quantize_q8k(&x, &mut q);
                    dot_q8k_scalar(ty, &w, &q)
                }
                ActFormat::F32 => unreachable!(),
            };
            // 8-bit activations: relative error of each product <= 1/254.
            let err = (got as f64 - exact).abs();
            assert!(err <= norm / 200.0 + 1e-5, "{ty:?}: got {got}, exact {exact}, |err| {err}, budget {}", norm / 200.0);
        }
    }

    #[test]
    fn float_dots_match() {
        let cols = 64;
        let x = rand_f32(9, cols);
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let w = rand_row(ty, cols, 5);
            let mut wf = vec![0f32; cols];
            dequantize_row(ty, &w, &mut wf);
            let exact: f32 = wf.iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((dot_float_scalar(ty, &w, &x) - exact).abs() < 1e-5);
        }
    }

    #[test]
    fn q8_blocks_round_trip() {
        let x = rand_f32(11, 64);
        let mut q = vec![BlockQ8::default(); 2];
        quantize_q8(&x, &mut q);
        for (i, v) in x.iter().enumerate() {
            let b = &q[i / 32];
            assert!((b.d * b.qs[i % 32] as f32 - v).abs() <= b.d * 0.5 + 1e-7);
        }
        let zero = [0f32; 32];
        quantize_q8(&zero, &mut q[..1]);
        assert_eq!((q[0].d, q[0].s), (0.0, 0.0));
    }
}
