// mvq_x_global.wgsl — x source of matvec_q8.wgsl: one Q8 row in memory (written by rmsnorm_q8.wgsl,
// quantize_q8.wgsl or attention.wgsl).
//   2 storage read  X: array<vec4<u32>>  one Q8 row of P.cols values (q8_act.wgsl)

@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;

fn prepare(li: u32) {}

fn xq(i: u32) -> vec4<u32> {
    return X[i];
}
