// dequant_q4_k.wgsl — `dequant_chunk` for Q4_K weights (prepended to matmul.wgsl / embed.wgsl,
// after k_scale_min.wgsl).
//
// Layout (GGML block_q4_K, 144 bytes per 256 weights): d: f16 at +0, dmin: f16 at +2, scales: 12
// bytes at +4 (eight 6-bit (scale, min) pairs, packed as in gguf::types::q4k_scale_min), qs: 128
// bytes at +16. Sub-block j (32 weights) uses the low nibbles of qs[32*(j/2) ..][0..32] when j is
// even, the high nibbles when odd; weight = d*scale_j*q - dmin*min_j. Chunk c is sub-block c % 8
// of super-block c / 8, at byte row + 144*(c/8). Bitwise equal to gguf::dequantize_row (d*scale*q
// and dmin*min are exact products, so the one rounding is the subtraction's).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + (c >> 3u) * 144u;
    let j = c & 7u;
    let sm = q4k_scale_min(b + 4u, j);
    let d1 = ld_f16(b) * f32(sm.x);
    let m1 = ld_f16(b + 2u) * f32(sm.y);
    let qb = (b + 16u + 32u * (j >> 1u)) >> 2u;
    let sh = vec4<u32>(4u * (j & 1u));
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = (bytes4(W[qb + k]) >> sh) & vec4<u32>(15u);
        w[k] = d1 * vec4<f32>(q) - m1;
    }
    return w;
}
