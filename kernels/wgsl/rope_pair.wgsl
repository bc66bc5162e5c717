// rope_pair.wgsl — the rotation of one (x0, x1) pair by (c, s) = (cos, sin), prepended to every
// kernel that applies RoPE (rope, rope_store, attention_one): written with explicit fused
// multiply-adds so that no driver contracts it differently in two shaders, which keeps the
// rotated bits of the layer runner's two paths (rope_store.wgsl + attention, attention_one)
// the same: (fma(x0, c, -(x1 s)), fma(x0, s, x1 c)).
fn rope_pair(x0: f32, x1: f32, c: f32, s: f32) -> vec2<f32> {
    return vec2<f32>(fma(x0, c, -(x1 * s)), fma(x0, s, x1 * c));
}
