//! K-quant super-blocks (256 elements): layouts and reference dequantizers of Q2_K, Q3_K, Q4_K,
//! Q5_K and Q6_K, element for element as GGML's `dequantize_row_q*_K`.
//!
//! | type | bytes | layout |
//! |------|-------|--------|
//! | Q2_K | 84  | scales[16] (low 4 bits scale, high 4 bits min, per 16), qs[64] (2 bits), d, dmin |
//! | Q3_K | 110 | hmask[32] (third bit), qs[64] (low 2 bits), scales[12] (6-bit, biased by 32, per 16), d |
//! | Q4_K | 144 | d, dmin, scales[12] (6-bit scale and min per 32), qs[128] (4 bits) |
//! | Q5_K | 176 | d, dmin, scales[12] (as Q4_K), qh[32] (fifth bit), qs[128] (low 4 bits) |
//! | Q6_K | 210 | ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8 per 16), d |

use super::f16_at;

/// Scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block, each 6 bits packed in 12 bytes.
pub fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The 16 six-bit scales of a Q3_K block (`s`: its 12 scale bytes), unbiased (-32..32):
/// scale i has its low 4 bits in byte i (i < 8, low nibble) or byte i - 8 (high nibble), and
/// its high 2 bits in byte 8 + i % 4 at bit 2 * (i / 4).
pub fn q3k_scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// Q2_K: y = d·sc·q - dmin·m per 16 elements; element 128·n + 32·j + l (l < 32) is bits 2j..2j+2
/// of qs[32·n + l], with scale byte 8·n + 2·j + l / 16.
pub fn dequantize_q2k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let sc = scales[8 * n + 2 * j + l / 16];
                let q = (qs[32 * n + l] >> (2 * j)) & 3;
                y[128 * n + 32 * j + l] = d * (sc & 0x0F) as f32 * q as f32 - dmin * (sc >> 4) as f32;
            }
        }
    }
}

/// Q3_K: y = d·(sc - 32)·(q - 4·!h): element 128·n + 32·j + l takes bits 2j..2j+2 of
/// qs[32·n + l] and bit 4·n + j of hmask[l] (set: no -4).
pub fn dequantize_q3k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs) = (&b[0..32], &b[32..96]);
    let scales = q3k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let sc = scales[8 * n + 2 * j + l / 16] as f32;
                let low = ((qs[32 * n + l] >> (2 * j)) & 3) as i32;
                let high = (hmask[l] >> (4 * n + j)) & 1;
                let q = low - if high == 1 { 0 } else { 4 };
                y[128 * n + 32 * j + l] = d * sc * q as f32;
            }
        }
    }
}

/// Q4_K: 8 sub-blocks of 32; sub-block pair (2i, 2i+1) shares 32 bytes of `qs`: low nibbles for
/// 2i, high nibbles for 2i+1.
pub fn dequantize_q4k(b: &[u8], y: &mut [f32]) {
    dequantize_q45k(b, &b[16..144], None, y)
}

/// Q5_K: Q4_K's layout plus a fifth bit: element 64·p + l (sub-block 2p) has bit 2p of qh[l],
/// element 64·p + 32 + l (sub-block 2p + 1) bit 2p + 1.
pub fn dequantize_q5k(b: &[u8], y: &mut [f32]) {
    dequantize_q45k(b, &b[48..176], Some(&b[16..48]), y)
}

/// Q4_K / Q5_K (with `qh`): y = d·sc·q - dmin·m per sub-block of 32.
fn dequantize_q45k(b: &[u8], qs: &[u8], qh: Option<&[u8]>, y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for pair in 0..4 {
        let (sc1, m1) = q4k_scale_min(2 * pair, scales);
        let (sc2, m2) = q4k_scale_min(2 * pair + 1, scales);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * pair..32 * pair + 32];
        for l in 0..32 {
            let (h1, h2) = match qh {
                Some(h) => (((h[l] >> (2 * pair)) & 1) << 4, ((h[l] >> (2 * pair + 1)) & 1) << 4),
                None => (0, 0),
            };
            y[64 * pair + l] = d1 * ((q[l] & 0x0F) | h1) as f32 - mm1;
            y[64 * pair + 32 + l] = d2 * ((q[l] >> 4) | h2) as f32 - mm2;
        }
    }
}

/// Q6_K: two halves of 128; in half h, element 32·g + l (g < 4) takes a nibble of ql (low of
/// ql[l] / ql[l + 32] for g = 0 / 1, high for g = 2 / 3) and bits 2g..2g+2 of qh[l], minus 32;
/// scale i8 per 16.
pub fn dequantize_q6k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
