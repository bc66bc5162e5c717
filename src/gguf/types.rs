//! GGML tensor element types, their block layouts, and the scalar reference dequantizers.
//!
//! Every block format is described by `(block_elems, block_bytes)`; a row of `n` elements of a
//! quantized type occupies `n / block_elems * block_bytes` bytes. The dequantizers here are the
//! reference that every SIMD / GPU kernel is tested against; keep them simple and obviously right.

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

pub mod kquant;

pub use kquant::q4k_scale_min;

/// Element type of a tensor, with GGML's numeric ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    BF16,
    MXFP4,
}

pub const QK: usize = 32; // elements per Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL / MXFP4 block
pub const QK_K: usize = 256; // elements per K-quant super-block

/// IQ4_NL's 16 non-linear levels (GGML's `kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// MXFP4's E2M1 levels, doubled (GGML's `kvalues_mxfp4`; the block scale is halved to match).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

impl GgmlType {
    /// Every supported type, in GGML id order.
    pub const ALL: [GgmlType; 15] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// Maps a GGML type id to a supported type; `None` for types this engine cannot run.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::IQ4NL => 20,
            GgmlType::BF16 => 30,
            GgmlType::MXFP4 => 39,
        }
    }

    /// Name of a GGML type id, for error messages (also for ids we do not support).
    pub fn name_of_id(id: u32) -> &'static str {
        match id {
            0 => "F32",
            1 => "F16",
            2 => "Q4_0",
            3 => "Q4_1",
            6 => "Q5_0",
            7 => "Q5_1",
            8 => "Q8_0",
            9 => "Q8_1",
            10 => "Q2_K",
            11 => "Q3_K",
            12 => "Q4_K",
            13 => "Q5_K",
            14 => "Q6_K",
            15 => "Q8_K",
            16 => "IQ2_XXS",
            17 => "IQ2_XS",
            18 => "IQ3_XXS",
            19 => "IQ1_S",
            20 => "IQ4_NL",
            21 => "IQ3_S",
            22 => "IQ2_S",
            23 => "IQ4_XS",
            24 => "I8",
            25 => "I16",
            26 => "I32",
            27 => "I64",
            28 => "F64",
            29 => "IQ1_M",
            30 => "BF16",
            34 => "TQ1_0",
            35 => "TQ2_0",
            39 => "MXFP4",
            _ => "unknown",
        }
    }

    pub fn name(self) -> &'static str {
        Self::name_of_id(self.id())
    }

    /// The type called `name` (GGML's spelling, any case: `q4_k`, `Q5_0`, `iq4_nl`, `mxfp4`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => QK,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            // d f16, qs[16]
            GgmlType::Q4_0 | GgmlType::IQ4NL => 2 + QK / 2,
            // d f16, m f16, qs[16]
            GgmlType::Q4_1 => 4 + QK / 2,
            // d f16, qh[4], qs[16]
            GgmlType::Q5_0 => 2 + 4 + QK / 2,
            // d f16, m f16, qh[4], qs[16]
            GgmlType::Q5_1 => 4 + 4 + QK / 2,
            // d f16, qs[32]
            GgmlType::Q8_0 => 2 + QK,
            // e (E8M0), qs[16]
            GgmlType::MXFP4 => 1 + QK / 2,
            // scales[16], qs[64], d f16, dmin f16
            GgmlType::Q2K => QK_K / 16 + QK_K / 4 + 4,
            // hmask[32], qs[64], scales[12], d f16
            GgmlType::Q3K => QK_K / 8 + QK_K / 4 + 12 + 2,
            // d f16, dmin f16, scales[12], qs[128]
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            // d f16, dmin f16, scales[12], qh[32], qs[128]
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            // ql[128], qh[64], scales[16], d f16
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }

    /// Bytes of a row of `n` elements, or `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if n % self.block_elems() != 0 {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The 32 high bits of a Q5_0 / Q5_1 block (`qh`, little-endian at `b[at..at + 4]`): bit j is
/// the fifth bit of element j.
#[inline]
pub fn q5_high_bits(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// MXFP4's block scale (an E8M0 exponent byte) as GGML's `GGML_E8M0_TO_FP32_HALF`: 2^(e - 128),
/// half the format's scale because [`MXFP4_VALUES`] are doubled.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// Dequantizes one row: `src` holds whole blocks of `ty`, `dst.len()` elements are written.
/// Panics only if the caller passes mismatched lengths (a programming error, checked by
/// `row_bytes` at load time).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    assert_eq!(Some(src.len()), ty.row_bytes(n), "dequantize_row: length mismatch");
    match ty {
        GgmlType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        // half's slice conversion (F16C / NEON where the CPU has it; a lookup of 512 rows of 2048
        // went from 3.7 to 1.1 ms on one Zen 3 core) where the bytes are 2-aligned little-endian
        // halves, else the element loop.
        GgmlType::F16 => match halves(src) {
            Some(h) => h.reinterpret_cast::<f16>().convert_to_f32_slice(dst),
            None => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        GgmlType::BF16 => match halves(src) {
            Some(h) => h.reinterpret_cast::<bf16>().convert_to_f32_slice(dst),
            None => {
                for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        },
        _ => {
            let (be, bb) = (ty.block_elems(), ty.block_bytes());
            for (y, b) in dst.chunks_exact_mut(be).zip(src.chunks_exact(bb)) {
                dequantize_block(ty, b, y);
            }
        }
    }
}

/// `src` as 16-bit words when it is 2-aligned and the machine little-endian (GGUF's byte order).
fn halves(src: &[u8]) -> Option<&[u16]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice(src).ok()
    } else {
        None
    }
}

/// One block of a quantized type (`b`: its bytes, `y`: its elements).
fn dequantize_block(ty: GgmlType, b: &[u8], y: &mut [f32]) {
    const H: usize = QK / 2;
    match ty {
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0);
            for j in 0..H {
                y[j] = ((b[2 + j] & 0x0F) as i32 - 8) as f32 * d;
                y[j + H] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
            }
        }
        GgmlType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for j in 0..H {
                y[j] = (b[4 + j] & 0x0F) as f32 * d + m;
                y[j + H] = (b[4 + j] >> 4) as f32 * d + m;
            }
        }
        GgmlType::Q5_0 => {
            let (d, qh) = (f16_at(b, 0), q5_high_bits(b, 2));
            for j in 0..H {
                let (lo, hi) = q5_pair(b[6 + j], qh, j);
                y[j] = (lo as i32 - 16) as f32 * d;
                y[j + H] = (hi as i32 - 16) as f32 * d;
            }
        }
        GgmlType::Q5_1 => {
            let (d, m, qh) = (f16_at(b, 0), f16_at(b, 2), q5_high_bits(b, 4));
            for j in 0..H {
                let (lo, hi) = q5_pair(b[8 + j], qh, j);
                y[j] = lo as f32 * d + m;
                y[j + H] = hi as f32 * d + m;
            }
        }
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..QK {
                y[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        GgmlType::IQ4NL => {
            let d = f16_at(b, 0);
            for j in 0..H {
                y[j] = d * IQ4NL_VALUES[(b[2 + j] & 0x0F) as usize] as f32;
                y[j + H] = d * IQ4NL_VALUES[(b[2 + j] >> 4) as usize] as f32;
            }
        }
        GgmlType::MXFP4 => {
            let d = e8m0_half(b[0]);
            for j in 0..H {
                y[j] = MXFP4_VALUES[(b[1 + j] & 0x0F) as usize] as f32 * d;
                y[j + H] = MXFP4_VALUES[(b[1 + j] >> 4) as usize] as f32 * d;
            }
        }
        GgmlType::Q2K => kquant::dequantize_q2k(b, y),
        GgmlType::Q3K => kquant::dequantize_q3k(b, y),
        GgmlType::Q4K => kquant::dequantize_q4k(b, y),
        GgmlType::Q5K => kquant::dequantize_q5k(b, y),
        GgmlType::Q6K => kquant::dequantize_q6k(b, y),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("{ty:?} has no blocks"),
    }
}

/// Elements j and j + 16 of a Q5_0 / Q5_1 block: the nibbles of `q` with their fifth bits
/// (bits j and j + 16 of `qh`), as unsigned 0..32.
#[inline]
pub fn q5_pair(q: u8, qh: u32, j: usize) -> (u8, u8) {
    let lo = (q & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
    let hi = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    (lo, hi)
}

#[cfg(test)]
mod tests;
