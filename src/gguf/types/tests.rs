//! Hand-computed blocks of every type against the reference dequantizers.

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

#[test]
fn new_type_sizes_and_ids_match_ggml() {
    for (ty, bytes, id, name) in [
        (GgmlType::Q5_0, 22, 6, "Q5_0"),
        (GgmlType::Q5_1, 24, 7, "Q5_1"),
        (GgmlType::Q2K, 84, 10, "Q2_K"),
        (GgmlType::Q3K, 110, 11, "Q3_K"),
        (GgmlType::Q5K, 176, 13, "Q5_K"),
        (GgmlType::IQ4NL, 18, 20, "IQ4_NL"),
        (GgmlType::MXFP4, 17, 39, "MXFP4"),
    ] {
        assert_eq!((ty.block_bytes(), ty.id(), ty.name()), (bytes, id, name));
        assert_eq!(GgmlType::from_id(id), Some(ty));
        assert_eq!(GgmlType::from_name(&name.to_lowercase()), Some(ty));
    }
    assert_eq!(GgmlType::from_id(23), None); // IQ4_XS: named in errors, not run
    assert_eq!(GgmlType::name_of_id(23), "IQ4_XS");
}

#[test]
fn q5_0_hand_block() {
    // d = 0.5; nibble j = j % 16; fifth bits: element 0 (bit 0), element 17 (bit 17).
    let mut b = h(0.5).to_vec();
    b.extend(((1u32 << 0) | (1u32 << 17)).to_le_bytes());
    b.extend((0..16u8).map(|j| (j << 4) | j));
    let mut y = [0f32; 32];
    dequantize_row(GgmlType::Q5_0, &b, &mut y);
    assert_eq!(y[0], (16 - 16) as f32 * 0.5); // 0 | 16
    assert_eq!(y[1], (1 - 16) as f32 * 0.5);
    assert_eq!(y[16], (0 - 16) as f32 * 0.5); // hi nibble of byte 0 = 0, no fifth bit
    assert_eq!(y[17], (1 + 16 - 16) as f32 * 0.5);
    assert_eq!(y[31], (15 - 16) as f32 * 0.5);
}

#[test]
fn q5_1_hand_block() {
    let mut b = h(0.25).to_vec();
    b.extend(h(-2.0));
    b.extend((1u32 << 31).to_le_bytes()); // fifth bit of element 31
    b.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
    let mut y = [0f32; 32];
    dequantize_row(GgmlType::Q5_1, &b, &mut y);
    assert_eq!(y[0], 15.0 * 0.25 - 2.0);
    assert_eq!(y[15], 0.0 * 0.25 - 2.0);
    assert_eq!(y[16], 0.0 * 0.25 - 2.0);
    assert_eq!(y[31], 31.0 * 0.25 - 2.0);
}

#[test]
fn iq4_nl_and_mxfp4_hand_blocks() {
    let mut b = h(2.0).to_vec();
    b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
    let mut y = [0f32; 32];
    dequantize_row(GgmlType::IQ4NL, &b, &mut y);
    assert_eq!((y[0], y[8], y[15], y[16], y[31]), (-254.0, 2.0, 226.0, 226.0, -254.0));

    // e = 129: scale 2^(129 - 128) = 2 (half of the format's 2^(129 - 127)).
    let mut b = vec![129u8];
    b.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
    dequantize_row(GgmlType::MXFP4, &b, &mut y);
    assert_eq!((y[0], y[7], y[9], y[15], y[16]), (0.0, 24.0, -2.0, -24.0, -24.0));
    assert_eq!((e8m0_half(127), e8m0_half(1), e8m0_half(0)), (0.5, 2f32.powi(-127), 2f32.powi(-128)));
}

#[test]
fn q2k_hand_block() {
    // scales[0] = 3 | 1 << 4 (sc 3, m 1) covers elements 0..16; scales[9] = 2 | 5 << 4 covers
    // n = 1, j = 0, l >= 16: elements 144..160.
    let mut b = vec![0u8; 84];
    b[0] = 0x13;
    b[9] = 0x52;
    b[16] = 0b11_10_01_10; // qs[0]: element 0 = 2, element 32 = 1, element 64 = 2, element 96 = 3
    b[16 + 32 + 16] = 0b01; // qs[48]: element 128 + 16 = 144 -> q = 1
    b[80..82].copy_from_slice(&h(0.5));
    b[82..84].copy_from_slice(&h(0.25));
    let mut y = [0f32; 256];
    dequantize_row(GgmlType::Q2K, &b, &mut y);
    assert_eq!(y[0], 0.5 * 3.0 * 2.0 - 0.25 * 1.0);
    assert_eq!(y[1], -0.25); // q 0
    assert_eq!(y[32], 0.0); // scale byte 2 is 0
    assert_eq!(y[144], 0.5 * 2.0 * 1.0 - 0.25 * 5.0);
}

#[test]
fn q3k_hand_block() {
    let mut b = vec![0u8; 110];
    // hmask[0] bit 0 set: element 0 has no -4; element 32 (bit 1 of hmask[0]) clear: -4.
    b[0] = 1;
    // qs[0]: element 0 low = 3, element 32 low = 1.
    b[32] = 0b01_11;
    // scale 0: low nibble of byte 96 = 5, high 2 bits (byte 104 bits 0..2) = 2 -> 37 - 32 = 5
    b[96] = 5;
    b[104] = 2;
    // scale 2 (elements 32..48): low nibble of byte 98 = 1, high bits of byte 106 bits 0..2 = 0 -> -31
    b[98] = 1;
    // scale 9 (elements 144..160): high nibble of byte 97, high bits byte 105 bits 4..6
    b[97] = 0x70;
    b[105] = 0b11 << 4; // -> 7 | 48 = 55 - 32 = 23
    b[108..110].copy_from_slice(&h(0.5));
    assert_eq!(kquant::q3k_scales(&b[96..108])[9], 23);
    let mut y = [0f32; 256];
    dequantize_row(GgmlType::Q3K, &b, &mut y);
    assert_eq!(y[0], 0.5 * 5.0 * 3.0);
    assert_eq!(y[32], 0.5 * -31.0 * (1.0 - 4.0));
    assert_eq!(y[144], 0.5 * 23.0 * -4.0); // q low 0, no high bit
}

#[test]
fn q5k_hand_block() {
    let mut s = [0u8; 12];
    s[0] = 2; // sc0
    s[4] = 3; // m0
    s[1] = 4; // sc1
    let mut b = h(1.0).to_vec();
    b.extend(h(0.5));
    b.extend(s);
    let mut qh = [0u8; 32];
    qh[0] = 0b11; // element 0 (sub-block 0) and element 32 (sub-block 1) get +16
    qh[1] = 0b100; // element 64 + 1 (sub-block 2) gets +16
    b.extend(qh);
    let mut qs = [0u8; 128];
    qs[0] = 0x21; // element 0 low 1, element 32 low 2
    b.extend(qs);
    let mut y = [0f32; 256];
    dequantize_row(GgmlType::Q5K, &b, &mut y);
    assert_eq!(y[0], 2.0 * 17.0 - 0.5 * 3.0);
    assert_eq!(y[32], 4.0 * 18.0);
    assert_eq!(y[1], -1.5);
    assert_eq!(y[65], 0.0); // sub-block 2 has scale 0 and min 0
}

#[test]
fn half_rows_convert_as_the_element_loop() {
    // every f16 / bf16 bit pattern class: normals, subnormals, zeros, infinities, NaNs
    let bits: Vec<u16> = (0..4096u32).map(|i| (i.wrapping_mul(40503) >> 4) as u16).chain([0, 0x8000, 0x0001, 0x7C00, 0xFC00, 0x7E00, 0x7F80]).collect();
    let mut bytes = vec![0u8];
    bytes.extend(bits.iter().flat_map(|b| b.to_le_bytes()));
    // aligned (the slice path) and at an odd address (the element loop)
    for src in [&bytes[1..], &bytes[..bytes.len() - 1]] {
        for ty in [GgmlType::F16, GgmlType::BF16] {
            let mut got = vec![0f32; bits.len()];
            dequantize_row(ty, src, &mut got);
            for (i, (g, c)) in got.iter().zip(src.chunks_exact(2)).enumerate() {
                let want = match ty {
                    GgmlType::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    _ => bf16::from_le_bytes([c[0], c[1]]).to_f32(),
                };
                assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "{ty:?} [{i}]: {g} vs {want}");
            }
        }
    }
}
