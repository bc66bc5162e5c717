// k_scale_min.wgsl — the 6-bit (scale, min) pair of sub-block j of a Q4_K / Q5_K super-block
// (prepended to dequant_q4_k.wgsl and dequant_q5_k.wgsl). `s`: byte offset of the block's 12
// scale bytes; packed as gguf::types::q4k_scale_min: sub-blocks 0..4 in the low 6 bits of bytes
// j and j + 4, sub-blocks 4..8 in the nibbles of byte j + 4 with their top 2 bits from the top
// bits of bytes j - 4 and j.

fn q4k_scale_min(s: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(ld_u8(s + j) & 63u, ld_u8(s + j + 4u) & 63u);
    }
    let hi = ld_u8(s + j + 4u);
    return vec2<u32>((hi & 15u) | ((ld_u8(s + j - 4u) >> 6u) << 4u), (hi >> 4u) | ((ld_u8(s + j) >> 6u) << 4u));
}
