// dequant_q5_0.wgsl — `dequant_chunk` for Q5_0 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout (GGML block_q5_0, 22 bytes per 32 weights): d: f16 at +0, qh: u32 at +2 (bit j is the
// fifth bit of element j), qs: 16 bytes at +6. Element j (j < 16) is ((qs[j] & 15) | bit j << 4)
// - 16, element j + 16 is ((qs[j] >> 4) | bit (j + 16) << 4) - 16, both times d. Chunk c is block
// c, at byte row + 22c (2-byte aligned: ld_u32 joins two words). Bitwise equal to
// gguf::dequantize_row (a 5-bit integer times an f16 is exact in f32).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + c * 22u;
    let d = ld_f16(b);
    let qh = vec4<u32>(ld_u32(b + 2u));
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = bytes4(ld_u32(b + 6u + 4u * k));
        let j = vec4<u32>(4u * k) + vec4<u32>(0u, 1u, 2u, 3u);
        let h_lo = ((qh >> j) & vec4<u32>(1u)) << vec4<u32>(4u);
        let h_hi = ((qh >> (j + vec4<u32>(16u))) & vec4<u32>(1u)) << vec4<u32>(4u);
        w[k] = (vec4<f32>((q & vec4<u32>(15u)) | h_lo) - 16.0) * d;
        w[k + 4u] = (vec4<f32>((q >> vec4<u32>(4u)) | h_hi) - 16.0) * d;
    }
    return w;
}
