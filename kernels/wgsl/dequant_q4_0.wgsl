// dequant_q4_0.wgsl — `dequant_chunk` for Q4_0 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout (GGML block_q4_0, 18 bytes per 32 weights): d: f16 at +0, qs: 16 bytes at +2. Element j
// (j < 16) is (qs[j] & 15) - 8, element j + 16 is (qs[j] >> 4) - 8, both times d. Chunk c is block
// c, at byte row + 18c (2-byte aligned). Bitwise equal to gguf::dequantize_row (the products are exact).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + c * 18u;
    let d = ld_f16(b);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = bytes4(ld_u32(b + 2u + 4u * k));
        w[k] = (vec4<f32>(q & vec4<u32>(15u)) - 8.0) * d;
        w[k + 4u] = (vec4<f32>(q >> vec4<u32>(4u)) - 8.0) * d;
    }
    return w;
}
