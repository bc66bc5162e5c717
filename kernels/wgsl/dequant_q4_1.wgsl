// dequant_q4_1.wgsl — `dequant_chunk` for Q4_1 weights (prepended to matmul.wgsl / embed.wgsl).
//
// Layout (GGML block_q4_1, 20 bytes per 32 weights): d: f16 at +0, m: f16 at +2, qs: 16 bytes at
// +4. Element j (j < 16) is (qs[j] & 15) * d + m, element j + 16 is (qs[j] >> 4) * d + m. Chunk c
// is block c, at byte row + 20c (4-byte aligned). Bitwise equal to gguf::dequantize_row (q * d is
// exact, so a fused multiply-add rounds the same as the reference's multiply then add).

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let b = row + c * 20u;
    let d = ld_f16(b);
    let m = ld_f16(b + 2u);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = bytes4(W[(b + 4u + 4u * k) >> 2u]);
        w[k] = vec4<f32>(q & vec4<u32>(15u)) * d + m;
        w[k + 4u] = vec4<f32>(q >> vec4<u32>(4u)) * d + m;
    }
    return w;
}
