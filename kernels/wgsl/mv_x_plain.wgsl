// mv_x_plain.wgsl — x source of matmul_vec.wgsl: the activations as they are.
//   2 storage read  X: array<vec4<f32>>  [cols] f32 (cols a multiple of 32)

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

fn prepare(li: u32) {}

fn xv(i: u32) -> vec4<f32> {
    return X[i];
}
