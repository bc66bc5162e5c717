// mv_f32.wgsl — `mv_acc` of matmul_vec.wgsl for f32 activations: chunk c of the row decoded
// (mv_w_lazy.wgsl / mv_w_eager.wgsl `chunk_at`: a chain of 32 fused multiply-adds from zero over the
// chunk against xv, mv_x_*.wgsl) and added to the lane's sum: matmul.wgsl + mm_x_f32.wgsl's chunk
// dot, the same bits. Prepended after the weight decoder, chunk_at and the x source.

fn dot4(s: f32, w: vec4<f32>, x: vec4<f32>) -> f32 {
    return fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, fma(w.x, x.x, s))));
}

fn chunk_dot(w: array<vec4<f32>, 8>, c: u32) -> f32 {
    var s = 0.0;
    s = dot4(s, w[0], xv(c, 0u));
    s = dot4(s, w[1], xv(c, 1u));
    s = dot4(s, w[2], xv(c, 2u));
    s = dot4(s, w[3], xv(c, 3u));
    s = dot4(s, w[4], xv(c, 4u));
    s = dot4(s, w[5], xv(c, 5u));
    s = dot4(s, w[6], xv(c, 6u));
    s = dot4(s, w[7], xv(c, 7u));
    return s;
}

fn mv_acc(acc: f32, row: u32, c: u32, nc: u32) -> f32 {
    return acc + chunk_at(row, c);
}
