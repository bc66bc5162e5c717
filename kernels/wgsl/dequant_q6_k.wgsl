// dequant_q6_k.wgsl — `dequant_chunk` for Q6_K weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout (GGML block_q6_K, 210 bytes per 256 weights): ql: 128 bytes at +0 (low 4 bits), qh: 64
// bytes at +128 (high 2 bits), scales: 16 signed bytes at +192, d: f16 at +208. Each half h of the
// block (128 weights) holds four groups g of 32: weight l of group g (l < 32) has low bits from
// ql[64h + l + 32*(g&1)] (low nibble for g < 2, high for g >= 2), high bits (qh[32h + l] >> 2g) & 3,
// scale scales[8h + 2g + l/16], and value (d * scale) * (q - 32). Chunk c is group (c%8)&3 of half
// (c%8)>>2 of super-block c/8, at byte row + 210*(c/8) (2-byte aligned). Bitwise equal to
// gguf::dequantize_row (same multiplication order, d*scale exact).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + (c >> 3u) * 210u;
    let sub = c & 7u;
    let h = sub >> 2u;
    let g = sub & 3u;
    let d = ld_f16(b + 208u);
    let ql = b + 64u * h + 32u * (g & 1u);
    let qh = b + 128u + 32u * h;
    let lsh = vec4<u32>(4u * (g >> 1u));
    let hsh = vec4<u32>(2u * g);
    let sc = b + 192u + 8u * h + 2u * g;
    let ds0 = d * f32(extractBits(bitcast<i32>(ld_u8(sc)), 0u, 8u));
    let ds1 = d * f32(extractBits(bitcast<i32>(ld_u8(sc + 1u)), 0u, 8u));
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (bytes4(ld_u32(ql + 4u * k)) >> lsh) & vec4<u32>(15u);
        let hi = (bytes4(ld_u32(qh + 4u * k)) >> hsh) & vec4<u32>(3u);
        let q = vec4<i32>(lo | (hi << vec4<u32>(4u))) - vec4<i32>(32);
        w[k] = select(ds0, ds1, k >= 4u) * vec4<f32>(q);
    }
    return w;
}
