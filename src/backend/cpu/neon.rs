//! aarch64 NEON kernels: the same contract as `avx2::matmul_rows_q8` (rows of a Q4_0 / Q4_1 /
//! Q8_0 matrix against 8-bit activations, token tiles of 4 sharing each unpacked weight block).
//! NEON is part of the aarch64 baseline, so no run-time detection is needed.

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;

use super::quant::BlockQ8;
use super::shared::{tile_rows, SharedOut};
use crate::backend::WeightView;
use crate::gguf::GgmlType;

/// The 32-element block types with a kernel here.
pub const Q8_TYPES: [GgmlType; 3] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0];

pub fn matmul_rows_q8(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
    let ty = w.ty;
    tile_rows(w, rows, acts, n_tok, out, |row, x, o| *o = dot::<4>(ty, row, x), |row, x, o| *o = dot::<1>(ty, row, x));
}

/// Sum of the 32 products of i8 weights `w` (two halves) and activations `x`.
#[inline(always)]
fn sum_i8(w0: int8x16_t, w1: int8x16_t, x: &BlockQ8) -> i32 {
    // SAFETY: NEON is baseline on aarch64; `qs` is 32 readable bytes.
    unsafe {
        let x0 = vld1q_s8(x.qs.as_ptr());
        let x1 = vld1q_s8(x.qs.as_ptr().add(16));
        let mut p = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
        p = vmlal_s8(p, vget_high_s8(w0), vget_high_s8(x0));
        let mut q = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
        q = vmlal_s8(q, vget_high_s8(w1), vget_high_s8(x1));
        vaddvq_s32(vaddq_s32(vpaddlq_s16(p), vpaddlq_s16(q)))
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline(always)]
fn dot<const NT: usize>(ty: GgmlType, w: &[u8], x: [&[BlockQ8]; NT]) -> [f32; NT] {
    let bb = ty.block_bytes();
    let mut acc = [0f32; NT];
    for (ib, wb) in w.chunks_exact(bb).enumerate() {
        // SAFETY: NEON is baseline on aarch64; every load reads inside the 18/20/34-byte block.
        let (d, m, w0, w1) = unsafe {
            match ty {
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let off = if ty == GgmlType::Q4_0 { 2 } else { 4 };
                    let q = vld1q_u8(wb.as_ptr().add(off));
                    let lo = vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
                    if ty == GgmlType::Q4_0 {
                        let eight = vdupq_n_s8(8);
                        (f16_at(wb, 0), 0.0, vsubq_s8(lo, eight), vsubq_s8(hi, eight))
                    } else {
                        (f16_at(wb, 0), f16_at(wb, 2), lo, hi)
                    }
                }
                _ => (f16_at(wb, 0), 0.0, vld1q_s8(wb.as_ptr().add(2) as *const i8), vld1q_s8(wb.as_ptr().add(18) as *const i8)),
            }
        };
        for t in 0..NT {
            let xb = &x[t][ib];
            acc[t] += d * xb.d * sum_i8(w0, w1, xb) as f32 + m * xb.s;
        }
    }
    acc
}
