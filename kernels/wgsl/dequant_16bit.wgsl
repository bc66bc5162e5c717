// dequant_16bit.wgsl — `dequant_chunk` for F16 and BF16 weights (prepended to matmul.wgsl /
// embed.wgsl after pair_f16.wgsl or pair_bf16.wgsl, which define `pair16`).
//
// Layout: a row is `cols` little-endian 16-bit floats; chunk c is elements 32c..32c+32, at byte
// row + 64c (rows start at multiples of 64 bytes since cols is a multiple of 32). Each word holds
// elements (2i, 2i+1) in its (low, high) halves. Exact.

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let i0 = (row + c * 64u) >> 2u;
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let i = i0 + 2u * k;
        w[k] = vec4<f32>(pair16(W[i]), pair16(W[i + 1u]));
    }
    return w;
}
