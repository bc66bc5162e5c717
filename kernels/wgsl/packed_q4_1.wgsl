// packed_q4_1.wgsl — `dequant_chunk` for Q4_1 weights repacked at upload (pack.rs), prepended
// after packed.wgsl (WT, Raw) to matmul.wgsl / matmul_vec.wgsl instead of bytes.wgsl +
// dequant_q4_1.wgsl. Same values, bitwise.
//
// Layout of W (binding 1, `array<vec4<u32>>`, 16-byte words) for a matrix of P.rows rows of
// nc = P.cols / 32 chunks (GGML block_q4_1: d f16, m f16, then 16 quant bytes):
//   W[i]            the 16 quant bytes of chunk i = r * nc + c (row r, block c), as in the block
//   W[rows * nc ..] (d, m) as one word (d in the low half), chunk i's at lane i % 4 of word i / 4
// The kernel's row offset `row` is r * P.row_bytes with P.row_bytes = nc, so chunk i = row + c.
// `load_chunk(i)` loads chunk i's words (Raw); `dequant_vec(raw, k)` decodes its vec4 k (the
// decode matmul decodes lazily, mv_w_lazy.wgsl), `dequant_raw` all eight.

fn load_chunk(i: u32) -> Raw {
    return Raw(W[i], vec4<u32>(0u), W[p.rows * (p.cols / 32u) + i / 4u][i % 4u]);
}

// Vec4 k (elements 4k .. 4k+3) of a chunk: low nibbles of quant word k for k < 4, high nibbles
// of word k - 4 after, times d plus m. Integers become floats by the exponent trick, not a
// conversion instruction: bitcast(0x4B000000 | n) - 2^23 is f32(n) exactly (packed_q4_0.wgsl).
fn dequant_vec(r: Raw, k: u32) -> vec4<f32> {
    let dm = unpack2x16float(r.s);
    let sh = select(vec4<u32>(0u, 8u, 16u, 24u), vec4<u32>(4u, 12u, 20u, 28u), k >= 4u);
    let n = (vec4<u32>(r.q[k % 4u]) >> sh) & vec4<u32>(15u);
    return (bitcast<vec4<f32>>(vec4<u32>(0x4B000000u) | n) - 8388608.0) * dm.x + dm.y;
}

// The whole chunk, as dequant_vec(r, 0..8) but written out (measured faster in matmul.wgsl).
fn dequant_raw(r: Raw) -> array<vec4<f32>, 8> {
    let dm = unpack2x16float(r.s);
    let e = vec4<u32>(0x4B000000u);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let v = vec4<u32>(r.q[k]);
        let lo = (v >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);
        let hi = (v >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u);
        w[k] = (bitcast<vec4<f32>>(e | lo) - 8388608.0) * dm.x + dm.y;
        w[k + 4u] = (bitcast<vec4<f32>>(e | hi) - 8388608.0) * dm.x + dm.y;
    }
    return w;
}

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    return dequant_raw(load_chunk(row + c));
}
