//! aarch64 NEON kernels: the same contracts as `avx2::matmul_rows_q8` (rows of a 32-element block
//! type against 8-bit activations) and `avx2_k::matmul_rows_q8k` (Q4_K / Q5_K / Q6_K against
//! Q8_K activations, bitwise the reference: the same integer sums and float formula per block),
//! token tiles of 4 sharing each unpacked weight block. NEON is part of the aarch64 baseline, so
//! no run-time detection is needed.

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;

use super::quant::{BlockQ8, BlockQ8K};
use super::shared::{tile_rows, tile_rows_with, SharedOut};
use crate::backend::WeightView;
use crate::gguf::types::{e8m0_half, q4k_scale_min, IQ4NL_VALUES, MXFP4_VALUES};
use crate::gguf::{GgmlType, QK_K};

/// The 32-element block types with a kernel here.
pub const Q8_TYPES: [GgmlType; 7] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4NL, GgmlType::MXFP4];
/// The K-quant types with a kernel here.
pub const Q8K_TYPES: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

pub fn matmul_rows_q8(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8], n_tok: usize, out: &SharedOut) {
    let ty = w.ty;
    tile_rows(w, rows, acts, n_tok, out, |row, x, o| *o = dot::<4>(ty, row, x), |row, x, o| *o = dot::<1>(ty, row, x));
}

pub fn matmul_rows_q8k(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
    let (ty, nb) = (w.ty, w.cols / QK_K);
    tile_rows_with(w, rows, acts, nb, n_tok, out, |row, x, o| *o = dot_k::<4>(ty, row, x), |row, x, o| *o = dot_k::<1>(ty, row, x));
}

/// Sum of the 32 products of i8 weights `w0` (elements 0..16), `w1` (16..32) and activations `x`.
#[inline(always)]
fn sum_i8(w0: int8x16_t, w1: int8x16_t, x: &[i8]) -> i32 {
    assert!(x.len() >= 32);
    // SAFETY: NEON is baseline on aarch64; 32 readable bytes (asserted).
    unsafe {
        let x0 = vld1q_s8(x.as_ptr());
        let x1 = vld1q_s8(x.as_ptr().add(16));
        vaddvq_s32(vaddq_s32(sum16(w0, x0), sum16(w1, x1)))
    }
}

/// Products of 16 i8 pairs, summed in pairs into 4 i32 lanes (|w · x| <= 128 · 128, two fit i16).
#[inline(always)]
fn sum16(w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        let p = vmull_s8(vget_low_s8(w), vget_low_s8(x));
        let q = vmull_s8(vget_high_s8(w), vget_high_s8(x));
        vaddq_s32(vpaddlq_s16(p), vpaddlq_s16(q))
    }
}

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// 0x10 in lane j where bit j of `bits` is set (a Q5 block's fifth bits, 16 at a time).
#[inline(always)]
fn fifth_bits(bits: u16) -> uint8x16_t {
    const MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: NEON is baseline on aarch64; MASK is 16 readable bytes.
    unsafe {
        let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
        vandq_u8(vtstq_u8(v, vld1q_u8(MASK.as_ptr())), vdupq_n_u8(0x10))
    }
}

/// The low and high nibbles of the 16 bytes at `b[at..]` (elements 0..16 and 16..32).
#[inline(always)]
fn nibbles(b: &[u8], at: usize) -> (uint8x16_t, uint8x16_t) {
    assert!(b.len() >= at + 16);
    // SAFETY: NEON is baseline on aarch64; 16 readable bytes (asserted).
    unsafe {
        let q = vld1q_u8(b.as_ptr().add(at));
        (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8(q, 4))
    }
}

/// The two halves of a block as i8 weights, its scale and its min (Q4_1 / Q5_1; else 0).
#[inline(always)]
fn unpack(ty: GgmlType, wb: &[u8]) -> (f32, f32, int8x16_t, int8x16_t) {
    // SAFETY: NEON is baseline on aarch64; every load reads inside the block (sizes per type).
    unsafe {
        let s = vreinterpretq_s8_u8;
        match ty {
            GgmlType::Q4_0 => {
                let (lo, hi) = nibbles(wb, 2);
                let eight = vdupq_n_s8(8);
                (f16_at(wb, 0), 0.0, vsubq_s8(s(lo), eight), vsubq_s8(s(hi), eight))
            }
            GgmlType::Q4_1 => {
                let (lo, hi) = nibbles(wb, 4);
                (f16_at(wb, 0), f16_at(wb, 2), s(lo), s(hi))
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let at = if ty == GgmlType::Q5_0 { 2 } else { 4 };
                let qh = u32::from_le_bytes([wb[at], wb[at + 1], wb[at + 2], wb[at + 3]]);
                let (lo, hi) = nibbles(wb, at + 4);
                let (lo, hi) = (s(vorrq_u8(lo, fifth_bits(qh as u16))), s(vorrq_u8(hi, fifth_bits((qh >> 16) as u16))));
                if ty == GgmlType::Q5_0 {
                    let k = vdupq_n_s8(16);
                    (f16_at(wb, 0), 0.0, vsubq_s8(lo, k), vsubq_s8(hi, k))
                } else {
                    (f16_at(wb, 0), f16_at(wb, 2), lo, hi)
                }
            }
            GgmlType::IQ4NL | GgmlType::MXFP4 => {
                let (table, d, at) = if ty == GgmlType::IQ4NL { (&IQ4NL_VALUES, f16_at(wb, 0), 2) } else { (&MXFP4_VALUES, e8m0_half(wb[0]), 1) };
                let t = vld1q_s8(table.as_ptr());
                let (lo, hi) = nibbles(wb, at);
                (d, 0.0, vqtbl1q_s8(t, lo), vqtbl1q_s8(t, hi))
            }
            _ => (f16_at(wb, 0), 0.0, vld1q_s8(wb.as_ptr().add(2) as *const i8), vld1q_s8(wb.as_ptr().add(18) as *const i8)),
        }
    }
}

#[inline(always)]
fn dot<const NT: usize>(ty: GgmlType, w: &[u8], x: [&[BlockQ8]; NT]) -> [f32; NT] {
    let bb = ty.block_bytes();
    let mut acc = [0f32; NT];
    for (ib, wb) in w.chunks_exact(bb).enumerate() {
        let (d, m, w0, w1) = unpack(ty, wb);
        for t in 0..NT {
            let xb = &x[t][ib];
            acc[t] += d * xb.d * sum_i8(w0, w1, &xb.qs) as f32 + m * xb.s;
        }
    }
    acc
}

/// One K-quant row against `NT` Q8_K activation rows: per block the unpacked weights, then the
/// reference's integer sums and float formula per token.
#[inline(always)]
fn dot_k<const NT: usize>(ty: GgmlType, w: &[u8], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
    let bb = ty.block_bytes();
    let mut acc = [0f32; NT];
    // weights of the block as 16 vectors of 16 i8, in element order
    let mut q = [[0i8; 16]; 16];
    for (ib, wb) in w.chunks_exact(bb).enumerate() {
        match ty {
            GgmlType::Q6K => {
                unpack_q6k(wb, &mut q);
                let d = f16_at(wb, 208);
                let sc = &wb[192..208];
                for t in 0..NT {
                    let xb = &x[t][ib];
                    let mut sum = 0i32;
                    for (g, qg) in q.iter().enumerate() {
                        sum += (sc[g] as i8) as i32 * sum_16(qg, &xb.qs[16 * g..]);
                    }
                    acc[t] += d * xb.d * sum as f32;
                }
            }
            _ => {
                unpack_q45k(ty == GgmlType::Q5K, wb, &mut q);
                let (dw, dminw) = (f16_at(wb, 0), f16_at(wb, 2));
                let scales = &wb[4..16];
                for t in 0..NT {
                    let xb = &x[t][ib];
                    let (mut sum_sc, mut sum_min) = (0i32, 0i32);
                    for j in 0..8 {
                        let (sc, m) = q4k_scale_min(j, scales);
                        let s = sum_16(&q[2 * j], &xb.qs[32 * j..]) + sum_16(&q[2 * j + 1], &xb.qs[32 * j + 16..]);
                        sum_sc += sc as i32 * s;
                        sum_min += m as i32 * (xb.bsums[2 * j] as i32 + xb.bsums[2 * j + 1] as i32);
                    }
                    acc[t] += dw * xb.d * sum_sc as f32 - dminw * xb.d * sum_min as f32;
                }
            }
        }
    }
    acc
}

/// Σ w·x over 16 values.
#[inline(always)]
fn sum_16(w: &[i8; 16], x: &[i8]) -> i32 {
    assert!(x.len() >= 16);
    // SAFETY: NEON is baseline on aarch64; 16 readable bytes each (asserted / array).
    unsafe { vaddvq_s32(sum16(vld1q_s8(w.as_ptr()), vld1q_s8(x.as_ptr()))) }
}

/// Q4_K / Q5_K weights (0..16 / 0..32) in element order.
#[inline(always)]
fn unpack_q45k(fifth: bool, wb: &[u8], q: &mut [[i8; 16]; 16]) {
    let (qh, qs) = if fifth { (&wb[16..48], &wb[48..176]) } else { (&wb[0..0], &wb[16..144]) };
    for pair in 0..4 {
        for l in 0..32 {
            let b = qs[32 * pair + l];
            let (mut lo, mut hi) = (b & 0x0F, b >> 4);
            if fifth {
                lo |= ((qh[l] >> (2 * pair)) & 1) << 4;
                hi |= ((qh[l] >> (2 * pair + 1)) & 1) << 4;
            }
            q[4 * pair + l / 16][l % 16] = lo as i8;
            q[4 * pair + 2 + l / 16][l % 16] = hi as i8;
        }
    }
}

/// Q6_K weights (-32..32) in element order.
#[inline(always)]
fn unpack_q6k(wb: &[u8], q: &mut [[i8; 16]; 16]) {
    for half in 0..2 {
        let (ql, qh) = (&wb[64 * half..64 * half + 64], &wb[128 + 32 * half..128 + 32 * half + 32]);
        for l in 0..32 {
            let v = [
                (ql[l] & 0x0F) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (g, val) in v.into_iter().enumerate() {
                // element 128·half + 32·g + l
                let e = 32 * g + l;
                q[8 * half + e / 16][e % 16] = val as i8 - 32;
            }
        }
    }
}
