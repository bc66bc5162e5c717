// packed_q4_0.wgsl — `dequant_chunk` for Q4_0 weights repacked at upload (pack.rs), prepended to
// matmul.wgsl / matmul_vec.wgsl instead of bytes.wgsl + dequant_q4_0.wgsl. Same values, bitwise.
//
// Layout of W (binding 1, `array<vec4<u32>>`, 16-byte words) for a matrix of P.rows rows of
// nc = P.cols / 32 chunks (GGML block_q4_0: d f16, then 16 quant bytes):
//   W[i]            the 16 quant bytes of chunk i = r * nc + c (row r, block c), as in the block
//   W[rows * nc ..] the f16 scales d, chunk i's at half (i % 8) of that region's word i / 8
// The kernel's row offset `row` is r * P.row_bytes with P.row_bytes = nc, so chunk i = row + c.
// Lanes of a row read consecutive chunks: 16-byte aligned loads, adjacent across lanes.

alias WT = vec4<u32>;

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    let i = row + c;
    let q4 = W[i];
    let s = W[p.rows * (p.cols / 32u) + i / 8u][(i / 2u) % 4u];
    let d = unpack2x16float(s >> (16u * (i % 2u))).x;
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let q = vec4<u32>(q4[k] & 0xFFu, (q4[k] >> 8u) & 0xFFu, (q4[k] >> 16u) & 0xFFu, q4[k] >> 24u);
        w[k] = (vec4<f32>(q & vec4<u32>(15u)) - 8.0) * d;
        w[k + 4u] = (vec4<f32>(q >> vec4<u32>(4u)) - 8.0) * d;
    }
    return w;
}
