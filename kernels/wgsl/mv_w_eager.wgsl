// mv_w_eager.wgsl — `chunk_at` of matmul_vec.wgsl for weights kept as raw GGUF blocks (bytes.wgsl +
// dequant_<type>.wgsl): the chunk is decoded whole, then dotted. No bindings of its own.
//
// chunk_at(row, c) = the chain of 32 fused multiply-adds from zero over chunk c of the row, in
// element order (matmul.wgsl's chunk dot; the same bits).

fn chunk_at(row: u32, c: u32) -> f32 {
    return chunk_dot(dequant_chunk(row, c), c);
}
