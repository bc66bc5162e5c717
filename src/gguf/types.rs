//! GGML tensor element types, their block layouts, and the scalar reference dequantizers.
//!
//! Every block format is described by `(block_elems, block_bytes)`; a row of `n` elements of a
//! quantized type occupies `n / block_elems * block_bytes` bytes. The dequantizers here are the
//! reference that every SIMD / GPU kernel is tested against; keep them simple and obviously right.

use half::{bf16, f16};

/// Element type of a tensor, with GGML's numeric ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q6K,
    BF16,
}

pub const QK: usize = 32; // elements per Q4_0 / Q4_1 / Q8_0 block
pub const QK_K: usize = 256; // elements per K-quant super-block

impl GgmlType {
    /// Every supported type, in enum order.
    pub const ALL: [GgmlType; 8] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::BF16,
    ];

    /// Maps a GGML type id to a supported type; `None` for types this engine cannot run.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
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
            30 => "BF16",
            _ => "unknown",
        }
    }

    pub fn name(self) -> &'static str {
        Self::name_of_id(self.id())
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => QK,
            GgmlType::Q4K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + QK / 2,
            GgmlType::Q4_1 => 4 + QK / 2,
            GgmlType::Q8_0 => 2 + QK,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
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
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
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
        GgmlType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = f16_at(b, 0);
                let qs = &b[2..];
                for j in 0..QK / 2 {
                    y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
                    y[j + QK / 2] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qs = &b[4..];
                for j in 0..QK / 2 {
                    y[j] = (qs[j] & 0x0F) as f32 * d + m;
                    y[j + QK / 2] = (qs[j] >> 4) as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (y, b) in dst.chunks_exact_mut(QK).zip(src.chunks_exact(ty.block_bytes())) {
                let d = f16_at(b, 0);
                for j in 0..QK {
                    y[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
        }
        GgmlType::Q4K => {
            for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(ty.block_bytes())) {
                dequantize_q4k_block(b, y);
            }
        }
        GgmlType::Q6K => {
            for (y, b) in dst.chunks_exact_mut(QK_K).zip(src.chunks_exact(ty.block_bytes())) {
                dequantize_q6k_block(b, y);
            }
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K block, each 6 bits packed in 12 bytes.
pub fn q4k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K block: d f16, dmin f16, scales [12], qs [128]. 8 sub-blocks of 32; sub-block pair
/// (2i, 2i+1) shares 32 bytes of `qs`: low nibbles for 2i, high nibbles for 2i+1.
fn dequantize_q4k_block(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for pair in 0..4 {
        let (sc1, m1) = q4k_scale_min(2 * pair, scales);
        let (sc2, m2) = q4k_scale_min(2 * pair + 1, scales);
        let (d1, mm1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, mm2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * pair..32 * pair + 32];
        for l in 0..32 {
            y[64 * pair + l] = d1 * (q[l] & 0x0F) as f32 - mm1;
            y[64 * pair + 32 + l] = d2 * (q[l] >> 4) as f32 - mm2;
        }
    }
}

/// Q6_K block: ql [128] (low 4 bits), qh [64] (high 2 bits), scales [16] i8, d f16.
fn dequantize_q6k_block(b: &[u8], y: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn sizes_match_ggml() {
        assert_eq!(GgmlType::Q4_0.block_bytes(), 18);
        assert_eq!(GgmlType::Q4_1.block_bytes(), 20);
        assert_eq!(GgmlType::Q8_0.block_bytes(), 34);
        assert_eq!(GgmlType::Q4K.block_bytes(), 144);
        assert_eq!(GgmlType::Q6K.block_bytes(), 210);
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
    }

    #[test]
    fn q4_0_hand_block() {
        // d = 0.5; byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
        let mut b = h(0.5).to_vec();
        b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &b, &mut y);
        assert_eq!(y[0], -4.0); // (0 - 8) * 0.5
        assert_eq!(y[15], 3.5); // (15 - 8) * 0.5
        assert_eq!(y[16], 3.5); // hi of byte 0 = 15
        assert_eq!(y[31], -4.0); // hi of byte 15 = 0
    }

    #[test]
    fn q4_1_hand_block() {
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| (1 << 4) | j));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_1, &b, &mut y);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[4], 0.0); // 4 * 0.25 - 1
        assert_eq!(y[15], 2.75);
        assert_eq!(y[16], -0.75);
    }

    #[test]
    fn q8_0_hand_block() {
        let mut b = h(2.0).to_vec();
        b.extend((0..32i32).map(|j| (j - 16) as i8 as u8));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q8_0, &b, &mut y);
        assert_eq!(y[0], -32.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 30.0);
    }

    #[test]
    fn q4k_hand_block() {
        // d = 1, dmin = 0.5. Sub-block scales/mins: j<4 from bytes j / j+4 (6 bits);
        // j>=4 take 4 bits from byte j+4 and 2 high bits from bytes j-4 / j.
        let mut s = [0u8; 12];
        s[0] = 3; // sc0 = 3
        s[4] = 2; // m0 = 2
        s[1] = 1 | (1 << 6); // sc1 = 1; top bits feed sc5's high bits
        s[5] = 4; // m1 = 4
        s[9] = 0x21; // sc5 low = 1, m5 low = 2
        let mut b = h(1.0).to_vec();
        b.extend(h(0.5));
        b.extend(s);
        let mut qs = [0u8; 128];
        qs[0] = 0x5A; // sub-block 0 elem 0 = 10, sub-block 1 elem 0 = 5
        qs[64] = 0x70; // sub-block 4 elem 0 = 0, sub-block 5 elem 0 = 7
        b.extend(qs);
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q4K, &b, &mut y);
        assert_eq!(y[0], 3.0 * 10.0 - 0.5 * 2.0);
        assert_eq!(y[1], -1.0); // q = 0
        assert_eq!(y[32], 1.0 * 5.0 - 0.5 * 4.0);
        // sub-block 5: sc = 1 | (1 << 4) = 17 (byte 1's top bits), m = 2 | ((s[5] >> 6) << 4) = 2
        assert_eq!(q4k_scale_min(5, &s), (17, 2));
        assert_eq!(y[160], 17.0 * 7.0 - 0.5 * 2.0);
    }

    #[test]
    fn q6k_hand_block() {
        let mut b = vec![0u8; 210];
        b[0] = 0x21; // ql[0]: low = 1 (elem 0), high = 2 (elem 64)
        b[128] = 0b11_10_01_00; // qh[0]: elem 0 hi=0, elem 32 hi=1, elem 64 hi=2, elem 96 hi=3
        for (i, s) in [1i8, 0, -2, 0, 3, 0, 4, 0].iter().enumerate() {
            b[192 + i] = *s as u8;
        }
        b[208..210].copy_from_slice(&h(0.5));
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q6K, &b, &mut y);
        assert_eq!(y[0], 0.5 * 1.0 * (1 - 32) as f32);
        assert_eq!(y[32], 0.5 * -2.0 * ((1 << 4) - 32) as f32);
        assert_eq!(y[64], 0.5 * 3.0 * ((2 | (2 << 4)) - 32) as f32);
        assert_eq!(y[96], 0.5 * 4.0 * ((3 << 4) - 32) as f32);
        assert_eq!(y[128], 0.0); // second half: scale 0
    }

    #[test]
    fn half_types() {
        let mut y = [0f32; 2];
        dequantize_row(GgmlType::F16, &[h(1.5), h(-2.0)].concat(), &mut y);
        assert_eq!(y, [1.5, -2.0]);
        let b: Vec<u8> = [bf16::from_f32(3.0), bf16::from_f32(-0.5)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(GgmlType::BF16, &b, &mut y);
        assert_eq!(y, [3.0, -0.5]);
    }
}
