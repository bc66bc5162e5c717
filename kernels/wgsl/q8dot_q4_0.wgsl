// q8dot_q4_0.wgsl — `chunk_q8` for Q4_0 weights (packed_q4_0.wgsl's load_chunk) against a Q8 block
// (q8_act.wgsl): acc + d_w * d_x * sum((q - 8) * x), the integer sum exact (nibble_dot,
// q8dot_nibbles.wgsl, minus 8 * isum), then one fused multiply-add into acc. matvec_q8.wgsl and
// mm_x_q8.wgsl call the same function, so a chunk adds the same bits in both.

fn chunk_q8(acc: f32, r: Raw, x0: vec4<u32>, x1: vec4<u32>, xm: vec4<u32>) -> f32 {
    let s = nibble_dot(r.q, x0, x1) - 8 * bitcast<i32>(xm.z);
    return fma(unpack2x16float(r.s).x * bitcast<f32>(xm.x), f32(s), acc);
}
