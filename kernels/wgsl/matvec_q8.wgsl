// matvec_q8.wgsl — `mv_acc` of matmul_vec.wgsl for Q4_0 / Q4_1 / Q8_0 weights against Q8
// activations: chunk c of the row folded into the lane's sum by chunk_q8 (q8dot_<type>.wgsl, an
// exact integer dot and one fused multiply-add), mm_x_q8.wgsl's step, the same bits. The input
// block comes from `xq` (mvq_x_global.wgsl: a Q8 row in memory; mvq_x_stage.wgsl: quantized, and
// normalized, by the workgroup itself). Composed as packed.wgsl + packed_<type>.wgsl +
// q8dot_<type>.wgsl + the x source + this file + matmul_vec.wgsl + its entry point and epilogue.

fn mv_acc(acc: f32, row: u32, c: u32, nc: u32) -> f32 {
    return chunk_q8(acc, load_chunk(row + c), xq(2u * c), xq(2u * c + 1u), xq(2u * nc + c));
}
