// quantize_q8.wgsl — f32 activation rows to Q8 rows, the input of the integer-dot matmuls
// (mm_x_q8.wgsl, matvec_q8.wgsl): the input part of q8_rows.wgsl. Composed as q8_act.wgsl
// (q8_coop) + this file + q8_rows.wgsl (entry point and dispatch).
//
// Bindings (group 0):
//   0 uniform P { cols, n_tok, swizzle, _ }
//   1 storage read  X: array<vec4<f32>>  [n_tok, cols / 4]; swizzle = 1: each row in matmul.wgsl's
//                                        chunk-major layout (vec4 k of block c at k * cols / 32 + c)
//   2 storage rw    Y: array<vec4<u32>>  [n_tok] Q8 rows (3 * cols / 32 words each)

struct P {
    cols: u32,
    n_tok: u32,
    swizzle: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<vec4<u32>>;

fn q8_shape() -> vec2<u32> {
    return vec2<u32>(p.cols, p.n_tok);
}

fn q8_in(t: u32, b: u32, k: u32) -> vec4<f32> {
    let nc = p.cols / 32u;
    return X[t * nc * 8u + select(8u * b + k, k * nc + b, p.swizzle != 0u)];
}
