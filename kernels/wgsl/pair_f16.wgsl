// pair_f16.wgsl — `pair16` for F16 weights, used by dequant_16bit.wgsl: the two IEEE half
// floats of a word (low half first) as f32. No bindings of its own.

fn pair16(q: u32) -> vec2<f32> {
    return unpack2x16float(q);
}
