// dequant_q5_k.wgsl — `dequant_chunk` for Q5_K weights (prepended to matmul.wgsl / embed.wgsl,
// after k_scale_min.wgsl).
//
// Layout (GGML block_q5_K, 176 bytes per 256 weights): d: f16 at +0, dmin: f16 at +2, scales: 12
// bytes at +4 (as Q4_K's), qh: 32 bytes at +16, qs: 128 bytes at +48. Sub-block j (32 weights)
// takes the low nibbles of qs[32*(j/2) ..][0..32] when j is even, the high nibbles when odd, and
// element l its fifth bit from bit j of qh[l]; weight = d*scale_j*q - dmin*min_j. Chunk c is
// sub-block c % 8 of super-block c / 8, at byte row + 176*(c/8). Bitwise equal to
// gguf::dequantize_row (d*scale*q and dmin*min are exact products, the one rounding is the
// subtraction's).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + (c >> 3u) * 176u;
    let j = c & 7u;
    let sm = q4k_scale_min(b + 4u, j);
    let d1 = ld_f16(b) * f32(sm.x);
    let m1 = ld_f16(b + 2u) * f32(sm.y);
    let qs = b + 48u + 32u * (j >> 1u);
    let sh = vec4<u32>(4u * (j & 1u));
    let hs = vec4<u32>(j);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (bytes4(ld_u32(qs + 4u * k)) >> sh) & vec4<u32>(15u);
        let hi = ((bytes4(ld_u32(b + 16u + 4u * k)) >> hs) & vec4<u32>(1u)) << vec4<u32>(4u);
        w[k] = d1 * vec4<f32>(lo | hi) - m1;
    }
    return w;
}
