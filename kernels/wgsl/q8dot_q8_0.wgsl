// q8dot_q8_0.wgsl — `chunk_q8` for Q8_0 weights (packed_q8_0.wgsl's load_chunk: q the first 16
// quant bytes, q1 the second) against a Q8 block (q8_act.wgsl): acc + d_w * d_x * sum(w * x), the
// integer sum exact (dot4I8Packed), then one fused multiply-add. Shared by matvec_q8.wgsl and
// mm_x_q8.wgsl.

fn chunk_q8(acc: f32, r: Raw, x0: vec4<u32>, x1: vec4<u32>, xm: vec4<u32>) -> f32 {
    var s = dot4I8Packed(r.q.x, x0.x) + dot4I8Packed(r.q.y, x0.y) + dot4I8Packed(r.q.z, x0.z) + dot4I8Packed(r.q.w, x0.w);
    s += dot4I8Packed(r.q1.x, x1.x) + dot4I8Packed(r.q1.y, x1.y) + dot4I8Packed(r.q1.z, x1.z) + dot4I8Packed(r.q1.w, x1.w);
    return fma(unpack2x16float(r.s).x * bitcast<f32>(xm.x), f32(s), acc);
}
