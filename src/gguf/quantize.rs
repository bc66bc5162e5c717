//! Quantizers for every weight type: f32 values to GGML blocks, for synthetic models and tests.
//!
//! The 32-element types follow GGML's reference quantizers (`quantize_row_*_ref`); the K-quants
//! use a plain min/max fit per sub-block (GGML searches for better scales, which only matters
//! for quality, not validity). Any valid block decodes the same in llama.cpp and here, which is
//! what the synthetic-model references rely on.

use half::f16;

use super::types::kquant::q4k_scale_min;
use super::types::{e8m0_half, IQ4NL_VALUES, MXFP4_VALUES};
use super::{GgmlType, QK, QK_K};

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn f16_round(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// The value of largest magnitude (with its sign), as GGML picks it.
fn signed_max(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// Quantizes `x` (a whole number of blocks of `ty`; panics otherwise) to `ty`, appending the
/// blocks to `out`.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) {
    assert!(x.len() % ty.block_elems() == 0, "quantize_row: {} values are not whole {} blocks", x.len(), ty.name());
    match ty {
        GgmlType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => x.iter().for_each(|v| out.extend(h(*v))),
        GgmlType::BF16 => x.iter().for_each(|v| out.extend(half::bf16::from_f32(*v).to_le_bytes())),
        _ => {
            for b in x.chunks_exact(ty.block_elems()) {
                quantize_block(ty, b, out);
            }
        }
    }
}

fn quantize_block(ty: GgmlType, b: &[f32], out: &mut Vec<u8>) {
    const HALF: usize = QK / 2;
    let pack = |q: &dyn Fn(f32) -> u8| -> Vec<u8> { (0..HALF).map(|j| (q(b[j]) & 0x0F) | (q(b[j + HALF]) << 4)).collect() };
    match ty {
        GgmlType::Q4_0 => {
            // The value of largest magnitude maps to -8.
            let d = signed_max(b) / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend(h(d));
            out.extend(pack(&|v| ((v * id + 8.5) as i32).clamp(0, 15) as u8));
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            let levels = if ty == GgmlType::Q4_1 { 15.0 } else { 31.0 };
            let (min, max) = b.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let d = (max - min) / levels;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend(h(d));
            out.extend(h(min));
            let q: Vec<u8> = b.iter().map(|&v| (((v - min) * id + 0.5) as i32).clamp(0, levels as i32) as u8).collect();
            if ty == GgmlType::Q5_1 {
                out.extend(high_bits(&q).to_le_bytes());
            }
            out.extend((0..HALF).map(|j| (q[j] & 0x0F) | ((q[j + HALF] & 0x0F) << 4)));
        }
        GgmlType::Q5_0 => {
            let d = signed_max(b) / -16.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend(h(d));
            let q: Vec<u8> = b.iter().map(|&v| ((v * id + 16.5) as i32).clamp(0, 31) as u8).collect();
            out.extend(high_bits(&q).to_le_bytes());
            out.extend((0..HALF).map(|j| (q[j] & 0x0F) | ((q[j + HALF] & 0x0F) << 4)));
        }
        GgmlType::Q8_0 => {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend(h(d));
            out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
        }
        GgmlType::IQ4NL => {
            // The value of largest magnitude maps to the first level (-127).
            let d = f16_round(signed_max(b) / IQ4NL_VALUES[0] as f32);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            out.extend(h(d));
            out.extend(pack(&|v| nearest_level(&IQ4NL_VALUES, v * id)));
        }
        GgmlType::MXFP4 => {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            // floor(log2(amax)) from the exponent bits (exact, no libm), as GGML's `floorf(log2f(amax))`
            // for normal numbers.
            let e = if amax > 0.0 { (((amax.to_bits() >> 23) & 0xFF) as i32 - 127 - 2 + 127).clamp(0, 254) as u8 } else { 0 };
            let id = 1.0 / e8m0_half(e);
            out.push(e);
            out.extend(pack(&|v| nearest_level(&MXFP4_VALUES, v * id)));
        }
        GgmlType::Q2K => quantize_q2k(b, out),
        GgmlType::Q3K => quantize_q3k(b, out),
        GgmlType::Q4K | GgmlType::Q5K => quantize_q45k(ty, b, out),
        GgmlType::Q6K => quantize_q6k(b, out),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("{ty:?} has no blocks"),
    }
}

/// Bit j = the fifth bit of element j (Q5_0 / Q5_1 `qh`).
fn high_bits(q: &[u8]) -> u32 {
    q.iter().enumerate().fold(0u32, |acc, (j, &v)| acc | (((v >> 4) as u32 & 1) << j))
}

/// Index of the level of `table` nearest to `v`.
fn nearest_level(table: &[i8; 16], v: f32) -> u8 {
    let mut best = 0;
    for (i, &t) in table.iter().enumerate() {
        if (t as f32 - v).abs() < (table[best] as f32 - v).abs() {
            best = i;
        }
    }
    best as u8
}

/// Quantizes `v` to `q` levels of step `d` above `-min` (0..=top), the K-quants' affine form.
fn affine(v: f32, d: f32, min: f32, top: i32) -> u8 {
    if d == 0.0 {
        return 0;
    }
    ((v + min) / d).round().clamp(0.0, top as f32) as u8
}

/// (scale, -min) of a sub-block for `levels` steps, the min clamped to at most 0.
fn fit(x: &[f32], levels: f32) -> (f32, f32) {
    let (min, max) = x.iter().fold((0f32, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    ((max - min) / levels, -min)
}

/// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
fn quantize_q45k(ty: GgmlType, b: &[f32], out: &mut Vec<u8>) {
    let top = if ty == GgmlType::Q4K { 15 } else { 31 };
    let fits: Vec<(f32, f32)> = b.chunks_exact(32).map(|s| fit(s, top as f32)).collect();
    let d = f16_round(fits.iter().fold(0f32, |m, f| m.max(f.0)) / 63.0);
    let dmin = f16_round(fits.iter().fold(0f32, |m, f| m.max(f.1)) / 63.0);
    let six = |v: f32, s: f32| if s > 0.0 { (v / s).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let sc: Vec<u8> = fits.iter().map(|f| six(f.0, d)).collect();
    let m: Vec<u8> = fits.iter().map(|f| six(f.1, dmin)).collect();
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    debug_assert!((0..8).all(|j| q4k_scale_min(j, &s) == (sc[j], m[j])));
    out.extend(h(d));
    out.extend(h(dmin));
    out.extend(s);
    let q: Vec<u8> = (0..QK_K).map(|i| affine(b[i], d * sc[i / 32] as f32, dmin * m[i / 32] as f32, top)).collect();
    if ty == GgmlType::Q5K {
        // qh[l] bit j: the fifth bit of element 32·j + l.
        out.extend((0..32).map(|l| (0..8).fold(0u8, |acc, j| acc | (((q[32 * j + l] >> 4) & 1) << j))));
    }
    // qs: sub-block pair p in bytes 32p..32p+32, low nibbles for 2p, high for 2p + 1.
    out.extend((0..128).map(|i| {
        let (p, l) = (i / 32, i % 32);
        (q[64 * p + l] & 0x0F) | ((q[64 * p + 32 + l] & 0x0F) << 4)
    }));
}

/// Per 16 values: signed scales, the value of largest magnitude at `-lowest` levels.
fn signed_scales(b: &[f32], lowest: f32, max_scale: f32) -> (f32, Vec<i32>) {
    let scales: Vec<f32> = b.chunks_exact(16).map(|s| signed_max(s) / -lowest).collect();
    let d = f16_round(scales.iter().fold(0f32, |m, s| m.max(s.abs())) / max_scale);
    let q = scales.iter().map(|s| if d > 0.0 { (s / d).round().clamp(-max_scale - 1.0, max_scale) as i32 } else { 0 }).collect();
    (d, q)
}

/// Q6_K: 16 groups of 16, i8 scales, 6-bit values minus 32.
fn quantize_q6k(b: &[f32], out: &mut Vec<u8>) {
    let (d, sc) = signed_scales(b, 32.0, 127.0);
    let q: Vec<u8> = (0..QK_K)
        .map(|i| {
            let s = d * sc[i / 16] as f32;
            if s == 0.0 { 32 } else { ((b[i] / s).round().clamp(-32.0, 31.0) as i32 + 32) as u8 }
        })
        .collect();
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for half in 0..2 {
        for l in 0..32 {
            let e = |g: usize| q[128 * half + 32 * g + l];
            ql[64 * half + l] = (e(0) & 0x0F) | ((e(2) & 0x0F) << 4);
            ql[64 * half + l + 32] = (e(1) & 0x0F) | ((e(3) & 0x0F) << 4);
            qh[32 * half + l] = (e(0) >> 4) | ((e(1) >> 4) << 2) | ((e(2) >> 4) << 4) | ((e(3) >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as i8 as u8));
    out.extend(h(d));
}

/// Q3_K: 16 groups of 16, 6-bit scales biased by 32, 3-bit values -4..4.
fn quantize_q3k(b: &[f32], out: &mut Vec<u8>) {
    let (d, sc) = signed_scales(b, 4.0, 31.0);
    let q: Vec<u8> = (0..QK_K)
        .map(|i| {
            let s = d * sc[i / 16] as f32;
            if s == 0.0 { 4 } else { ((b[i] / s).round().clamp(-4.0, 3.0) as i32 + 4) as u8 }
        })
        .collect();
    let (mut hmask, mut qs) = ([0u8; 32], [0u8; 64]);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let v = q[128 * n + 32 * j + l];
                qs[32 * n + l] |= (v & 3) << (2 * j);
                hmask[l] |= (v >> 2) << (4 * n + j);
            }
        }
    }
    let mut s = [0u8; 12];
    for (i, &v) in sc.iter().enumerate() {
        let v = (v + 32) as u8;
        if i < 8 {
            s[i] |= v & 0x0F;
        } else {
            s[i - 8] |= (v & 0x0F) << 4;
        }
        s[8 + i % 4] |= (v >> 4) << (2 * (i / 4));
    }
    out.extend(hmask);
    out.extend(qs);
    out.extend(s);
    out.extend(h(d));
}

/// Q2_K: 16 groups of 16, 4-bit scales and mins, 2-bit values.
fn quantize_q2k(b: &[f32], out: &mut Vec<u8>) {
    let fits: Vec<(f32, f32)> = b.chunks_exact(16).map(|s| fit(s, 3.0)).collect();
    let d = f16_round(fits.iter().fold(0f32, |m, f| m.max(f.0)) / 15.0);
    let dmin = f16_round(fits.iter().fold(0f32, |m, f| m.max(f.1)) / 15.0);
    let four = |v: f32, s: f32| if s > 0.0 { (v / s).round().clamp(0.0, 15.0) as u8 } else { 0 };
    let sc: Vec<u8> = fits.iter().map(|f| four(f.0, d)).collect();
    let m: Vec<u8> = fits.iter().map(|f| four(f.1, dmin)).collect();
    let mut qs = [0u8; 64];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let i = 128 * n + 32 * j + l;
                let g = i / 16;
                qs[32 * n + l] |= affine(b[i], d * sc[g] as f32, dmin * m[g] as f32, 3) << (2 * j);
            }
        }
    }
    out.extend((0..16).map(|g| sc[g] | (m[g] << 4)));
    out.extend(qs);
    out.extend(h(d));
    out.extend(h(dmin));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::dequantize_row;

    /// Every type round-trips within its quantization step (plus the scales' own rounding):
    /// the quantizers write the layouts the reference dequantizers read.
    #[test]
    fn every_type_round_trips() {
        let x: Vec<f32> = (0..1024).map(|i| ((i as f32 * 0.37).sin() + (i as f32 * 0.011).cos()) * 0.05).collect();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // worst-case error per element as a fraction of the block's magnitude
        for (ty, tol) in [
            (GgmlType::Q4_0, 1.0 / 8.0),
            (GgmlType::Q4_1, 1.0 / 15.0),
            (GgmlType::Q5_0, 1.0 / 16.0),
            (GgmlType::Q5_1, 1.0 / 31.0),
            (GgmlType::Q8_0, 1.0 / 127.0),
            (GgmlType::IQ4NL, 1.0 / 8.0),
            (GgmlType::MXFP4, 1.0 / 3.0),
            (GgmlType::Q2K, 1.0 / 2.0),
            (GgmlType::Q3K, 1.0 / 3.0),
            (GgmlType::Q4K, 1.0 / 6.0),
            (GgmlType::Q5K, 1.0 / 12.0),
            (GgmlType::Q6K, 1.0 / 24.0),
            (GgmlType::F16, 1e-3),
        ] {
            let mut q = Vec::new();
            quantize_row(ty, &x, &mut q);
            assert_eq!(Some(q.len()), ty.row_bytes(x.len()), "{ty:?}");
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y);
            let err = x.iter().zip(&y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol * amax, "{ty:?}: max error {err} > {}", tol * amax);
            let mean = x.iter().zip(&y).map(|(a, b)| (a - b).abs()).sum::<f32>() / x.len() as f32;
            assert!(mean <= tol * amax / 2.0, "{ty:?}: mean error {mean}");
        }
    }
}
