// dequant_q8_0.wgsl — `dequant_chunk` for Q8_0 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout (GGML block_q8_0, 34 bytes per 32 weights): d: f16 at +0, qs: 32 signed bytes at +2;
// element j is qs[j] * d. Chunk c is block c, at byte row + 34c (2-byte aligned). Exact.

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + c * 34u;
    let d = ld_f16(b);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = bitcast<i32>(ld_u32(b + 2u + 4u * k));
        let v = vec4<i32>(extractBits(q, 0u, 8u), extractBits(q, 8u, 8u), extractBits(q, 16u, 8u), extractBits(q, 24u, 8u));
        w[k] = vec4<f32>(v) * d;
    }
    return w;
}
