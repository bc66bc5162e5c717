// pair_bf16.wgsl — `pair16` for BF16 weights, used by dequant_16bit.wgsl: the two bfloat16 values
// of a word (low half first; each is the top 16 bits of an f32). No bindings of its own.

fn pair16(q: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(q << 16u), bitcast<f32>(q & 0xFFFF0000u));
}
