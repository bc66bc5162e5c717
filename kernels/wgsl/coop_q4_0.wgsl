// coop_q4_0.wgsl — the Q4_0 dequantization into workgroup memory that the tensor-core matmuls
// share (matmul_coop.wgsl, matvec_coop.wgsl): each declares `sa: array<f16, ..>`, the staged
// weights, and this file writes it. Both round every weight the same way, so the products they
// feed to the tensor cores are the same operands.

fn put4(o: u32, v: vec4<f16>) {
    sa[o] = v.x; sa[o + 1u] = v.y; sa[o + 2u] = v.z; sa[o + 3u] = v.w;
}

// Word w of a chunk's quants: elements 4 of the low nibbles and 4 of the high (16 on) as f16,
// d * (q - 8): 2^23 + q - (2^23 + 8) is q - 8 exactly, times d in f32, rounded once to f16.
fn dequant_word(o: u32, w: u32, d: f32) {
    let e = vec4<u32>(0x4B000000u);
    let v = vec4<u32>(w);
    put4(o, vec4<f16>((bitcast<vec4<f32>>(e | ((v >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u))) - 8388616.0) * d));
    put4(o + 16u, vec4<f16>((bitcast<vec4<f32>>(e | ((v >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u))) - 8388616.0) * d));
}
