// mv_x_plain.wgsl — x source of matmul_vec.wgsl: the activations as they are, in the swizzled
// layout of mm_x_f32.wgsl's X (written so by rmsnorm.wgsl and attention.wgsl in the layer runner).
//   2 storage read  X: array<vec4<f32>>  [cols] f32 (cols a multiple of 32); chunk c's vec4 k at k * (cols / 32) + c

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

fn prepare(li: u32) {}

fn xv(c: u32, k: u32) -> vec4<f32> {
    return X[k * (p.cols / 32u) + c];
}
