// dequant_f32.wgsl — `dequant_chunk` for F32 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout: a row is `cols` little-endian f32 (4 bytes each); chunk c is elements 32c..32c+32, at
// byte row + 128c. Rows start at multiples of 128 bytes (cols is a multiple of 32), so words are
// read directly. Exact.

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let i0 = (row + c * 128u) >> 2u;
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = i0 + 4u * k;
        w[k] = vec4<f32>(bitcast<f32>(W[i]), bitcast<f32>(W[i + 1u]), bitcast<f32>(W[i + 2u]), bitcast<f32>(W[i + 3u]));
    }
    return w;
}
