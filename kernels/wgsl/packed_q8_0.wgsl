// packed_q8_0.wgsl — `dequant_chunk` for Q8_0 weights repacked at upload (pack.rs), prepended to
// matmul.wgsl / matmul_vec.wgsl instead of bytes.wgsl + dequant_q8_0.wgsl. Same values, bitwise.
//
// Layout of W (binding 1, `array<vec4<u32>>`, 16-byte words) for a matrix of P.rows rows of
// nc = P.cols / 32 chunks (GGML block_q8_0: d f16, then 32 signed quant bytes):
//   W[2i], W[2i + 1]    the 32 quant bytes of chunk i = r * nc + c (row r, block c), in order
//   W[2 * rows * nc ..] the f16 scales d, chunk i's at half (i % 8) of that region's word i / 8
// The kernel's row offset `row` is r * P.row_bytes with P.row_bytes = nc, so chunk i = row + c.

alias WT = vec4<u32>;

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = row + c;
    let s = W[2u * p.rows * (p.cols / 32u) + i / 8u][(i / 2u) % 4u];
    let d = unpack2x16float(s >> (16u * (i % 2u))).x;
    var w: array<vec4<f32>, 8>;
    for (var h = 0u; h < 2u; h++) {
        let q4 = bitcast<vec4<i32>>(W[2u * i + h]);
        for (var k = 0u; k < 4u; k++) {
            let q = q4[k];
            let v = vec4<i32>(extractBits(q, 0u, 8u), extractBits(q, 8u, 8u), extractBits(q, 16u, 8u), extractBits(q, 24u, 8u));
            w[4u * h + k] = vec4<f32>(v) * d;
        }
    }
    return w;
}
