// rms_bind.wgsl — parameters and bindings 0-2 of rmsnorm.wgsl and rmsnorm_q8.wgsl (prepended,
// with rms_scale.wgsl):
//   0 uniform P { dim (a multiple of 4), n_tok, eps (f32), swizzle, add (rmsnorm.wgsl only) }
//   1 storage read  X: array<vec4<f32>>  [n_tok, dim / 4]
//   2 storage read  G: array<vec4<f32>>  [dim / 4] weight

struct P {
    dim: u32,
    n_tok: u32,
    eps: f32,
    swizzle: u32,
    add: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> G: array<vec4<f32>>;

fn rms_x(j: u32) -> vec4<f32> {
    return X[j];
}
