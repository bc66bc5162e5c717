// mv_w_lazy.wgsl — `chunk_at` of matmul_vec.wgsl for the types repacked at upload
// (packed_<type>.wgsl): the chunk's packed words are loaded (5 registers) and decoded one vec4 at
// a time inside the dot, so that few registers are live (measured on the H100: the decode matmul
// is bound by how many warps are resident). No bindings of its own.
//
// chunk_at(row, c) = the chain of 32 fused multiply-adds from zero over chunk c of the row, in
// element order (matmul.wgsl's chunk dot; the same bits).

fn chunk_at(row: u32, c: u32) -> f32 {
    let r = load_chunk(row + c);
    var s = 0.0;
    for (var k = 0u; k < 8u; k++) {
        s = dot4(s, dequant_vec(r, k), xv(c, k));
    }
    return s;
}
