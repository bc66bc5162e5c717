// mm_x_q8.wgsl — input of matmul.wgsl for Q8 activations (after packed.wgsl + packed_<type>.wgsl +
// q8dot_<type>.wgsl; Q4_0, Q4_1, Q8_0): the `matmul_q8` pipelines, one-token twin matvec_q8.wgsl.
//   2 storage read  X: array<vec4<u32>>  [n_tok] Q8 rows of `cols` values (q8_act.wgsl: 3 * cols / 32
//                                        words each)
// A chunk's packed words are loaded once (mm_chunk) and folded into each token's lane sum by
// chunk_q8: an exact integer dot, one fused multiply-add (mm_acc).

@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;

alias MmChunk = Raw;

fn mm_chunk(row: u32, c: u32) -> MmChunk {
    return load_chunk(row + c);
}

fn mm_acc(acc: f32, w: MmChunk, t: u32, c: u32, nc: u32) -> f32 {
    let xb = t * 3u * nc;
    return chunk_q8(acc, w, X[xb + 2u * c], X[xb + 2u * c + 1u], X[xb + 2u * nc + c]);
}
