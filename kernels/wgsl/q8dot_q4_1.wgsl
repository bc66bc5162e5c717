// q8dot_q4_1.wgsl — `chunk_q8` for Q4_1 weights (packed_q4_1.wgsl's load_chunk) against a Q8 block
// (q8_act.wgsl): acc + m_w * s_x + d_w * d_x * sum(q * x), the integer sum exact (nibble_dot,
// q8dot_nibbles.wgsl), as two fused multiply-adds. Shared by matvec_q8.wgsl and mm_x_q8.wgsl.

fn chunk_q8(acc: f32, r: Raw, x0: vec4<u32>, x1: vec4<u32>, xm: vec4<u32>) -> f32 {
    let dm = unpack2x16float(r.s);
    return fma(dm.x * bitcast<f32>(xm.x), f32(nibble_dot(r.q, x0, x1)), fma(dm.y, bitcast<f32>(xm.y), acc));
}
