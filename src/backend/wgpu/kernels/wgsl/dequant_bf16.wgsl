// dequant_bf16.wgsl — `dequant_chunk` for BF16 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout: a row is `cols` little-endian bf16 (the top 16 bits of an f32); chunk c is elements
// 32c..32c+32 at byte row + 64c; each word holds elements (2i, 2i+1) in its (low, high) halves. Exact.

fn bf16_pair(q: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(q << 16u), bitcast<f32>(q & 0xFFFF0000u));
}

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let i0 = (row + c * 64u) >> 2u;
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = i0 + 2u * k;
        w[k] = vec4<f32>(bf16_pair(W[i]), bf16_pair(W[i + 1u]));
    }
    return w;
}
