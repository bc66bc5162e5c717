// packed_q8_0.wgsl — `dequant_chunk` for Q8_0 weights repacked at upload (pack.rs), prepended
// after packed.wgsl (WT, Raw) to matmul.wgsl / matmul_vec.wgsl instead of bytes.wgsl +
// dequant_q8_0.wgsl. Same values, bitwise.
//
// Layout of W (binding 1, `array<vec4<u32>>`, 16-byte words) for a matrix of P.rows rows of
// nc = P.cols / 32 chunks (GGML block_q8_0: d f16, then 32 signed quant bytes):
//   W[2i], W[2i + 1]    the 32 quant bytes of chunk i = r * nc + c (row r, block c), in order
//   W[2 * rows * nc ..] the f16 scales d, chunk i's at half (i % 8) of that region's word i / 8
// The kernel's row offset `row` is r * P.row_bytes with P.row_bytes = nc, so chunk i = row + c.
// `load_chunk(i)` loads chunk i's words (Raw); `dequant_vec(raw, k)` decodes its vec4 k (the
// decode matmul decodes lazily, mv_w_lazy.wgsl), `dequant_raw` all eight.

fn load_chunk(i: u32) -> Raw {
    let s = W[2u * p.rows * (p.cols / 32u) + i / 8u][(i / 2u) % 4u];
    return Raw(W[2u * i], W[2u * i + 1u], s >> (16u * (i % 2u)));
}

// Vec4 k (elements 4k .. 4k+3) of a chunk: quant word k (q for k < 4, q1 after), each byte
// signed, times d. Integers become floats by the exponent trick, not a conversion instruction: a
// signed byte b read unsigned as u has u ^ 0x80 = b + 128, and bitcast(0x4B000000 | (b + 128)) -
// (2^23 + 128) is b exactly (packed_q4_0.wgsl).
fn dequant_vec(r: Raw, k: u32) -> vec4<f32> {
    let q = select(r.q[k % 4u], r.q1[k % 4u], k >= 4u);
    let n = ((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu)) ^ vec4<u32>(0x80u);
    return (bitcast<vec4<f32>>(vec4<u32>(0x4B000000u) | n) - 8388736.0) * unpack2x16float(r.s).x;
}

// The whole chunk, as dequant_vec(r, 0..8) but written out (measured faster in matmul.wgsl).
fn dequant_raw(r: Raw) -> array<vec4<f32>, 8> {
    let d = unpack2x16float(r.s).x;
    let e = vec4<u32>(0x4B000000u);
    var w: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let a = ((vec4<u32>(r.q[k]) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu)) ^ vec4<u32>(0x80u);
        let b = ((vec4<u32>(r.q1[k]) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu)) ^ vec4<u32>(0x80u);
        w[k] = (bitcast<vec4<f32>>(e | a) - 8388736.0) * d;
        w[k + 4u] = (bitcast<vec4<f32>>(e | b) - 8388736.0) * d;
    }
    return w;
}

fn dequant_chunk(row: u32, c: u32) -> array<vec4<f32>, 8> {
    return dequant_raw(load_chunk(row + c));
}
