// silu_mul_q8.wgsl — the gated FFN activation written as Q8 rows (the down projection's input when
// it multiplies by integer dots): silu_mul.wgsl's values (gated.wgsl, the same expression)
// quantized by q8_coop, as quantize_q8.wgsl would quantize silu_mul.wgsl's output, without the
// f32 rows in between. The input part of q8_rows.wgsl: composed as q8_act.wgsl + gated.wgsl +
// this file + q8_rows.wgsl (entry point and dispatch). width a multiple of 32.
//
// Bindings (group 0): 0-2 see gated.wgsl (swizzle ignored);
//   3 storage rw    Y: array<vec4<u32>>  [n_tok] Q8 rows (3 * width / 32 words each, q8_act.wgsl)

@group(0) @binding(3) var<storage, read_write> Y: array<vec4<u32>>;

fn q8_shape() -> vec2<u32> {
    return vec2<u32>(p.width, p.n_tok);
}

fn q8_in(t: u32, b: u32, k: u32) -> vec4<f32> {
    let e = 32u * b + 4u * k;
    return vec4<f32>(gated(t, e), gated(t, e + 1u), gated(t, e + 2u), gated(t, e + 3u));
}
