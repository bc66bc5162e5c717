//! Deterministic random weights and activations for kernel tests.

use half::f16;

use crate::gguf::GgmlType;

/// Deterministic pseudo-random numbers (xorshift), no dependency needed.
pub fn rand_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn rand_bytes(seed: u64, n: usize) -> Vec<u8> {
    rand_f32(seed, n).iter().map(|v| ((v + 1.0) * 127.9) as u8).collect()
}

/// Random weight row of `ty` with sane (finite, small) f16 scales.
pub fn rand_row(ty: GgmlType, cols: usize, seed: u64) -> Vec<u8> {
    let mut b = rand_bytes(seed, ty.row_bytes(cols).expect("whole blocks"));
    let scale = |b: &mut [u8], at: usize, v: f32| b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
    let bb = ty.block_bytes();
    for (i, blk) in b.chunks_exact_mut(bb).enumerate() {
        let v = 0.01 + (i % 7) as f32 * 0.003;
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4NL => scale(blk, 0, v),
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                scale(blk, 0, v);
                scale(blk, 2, -0.05);
            }
            GgmlType::MXFP4 => blk[0] = 118 + (i % 5) as u8,
            GgmlType::Q4K | GgmlType::Q5K => {
                scale(blk, 0, v);
                scale(blk, 2, 0.002);
            }
            GgmlType::Q2K => {
                scale(blk, 80, v);
                scale(blk, 82, 0.002);
            }
            GgmlType::Q3K => scale(blk, 108, v),
            GgmlType::Q6K => scale(blk, 208, v),
            GgmlType::F16 => scale(blk, 0, (i as f32 * 0.37).sin()),
            GgmlType::BF16 => blk.copy_from_slice(&half::bf16::from_f32((i as f32 * 0.37).sin()).to_le_bytes()),
            GgmlType::F32 => {}
        }
    }
    if ty == GgmlType::F32 {
        for (i, c) in b.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&((i as f32 * 0.37).sin()).to_le_bytes());
        }
    }
    b
}

