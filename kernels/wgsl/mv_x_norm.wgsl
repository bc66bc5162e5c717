// mv_x_norm.wgsl — x source of matmul_vec.wgsl with RMSNorm folded in: xv(c, k) = X[i] * scale * G[i]
// with i = 8c + k (X is the residual stream, plain layout), scale = rms_scale.wgsl's (prepended),
// computed by every workgroup in rmsnorm.wgsl's order, so the values are the bits rmsnorm.wgsl
// would have written.
//   2 storage read  X: array<vec4<f32>>  [cols] the residual stream
//   4 storage read  G: array<vec4<f32>>  [cols] the norm weight
// P.eps holds eps as f32 bits; the norm's dim is P.cols.

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> G: array<vec4<f32>>;

var<workgroup> norm_scale: f32;

fn rms_x(j: u32) -> vec4<f32> {
    return X[j];
}

fn prepare(li: u32) {
    let s = rms_scale(li, 0u, p.cols, bitcast<f32>(p.eps));
    if (li == 0u) {
        norm_scale = s;
    }
    workgroupBarrier();
}

fn xv(c: u32, k: u32) -> vec4<f32> {
    let i = c * 8u + k;
    return X[i] * norm_scale * G[i];
}
