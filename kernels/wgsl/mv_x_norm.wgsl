// mv_x_norm.wgsl — x source of matmul_vec.wgsl with RMSNorm folded in: xv(c, k) = X[i] * scale * G[i]
// with i = 8c + k (X is the residual stream, plain layout),
// scale = 1 / sqrt(mean(X^2) + eps), computed by every workgroup exactly as rmsnorm.wgsl does
// (thread i sums the squares of elements i, i+256, ... by fused multiply-adds, then the tree of
// strides 128, ..., 1), so the values are the bits rmsnorm.wgsl would have written.
//   2 storage read  X: array<vec4<f32>>  [cols] the residual stream
//   4 storage read  G: array<vec4<f32>>  [cols] the norm weight
// P.eps holds eps as f32 bits; the norm's dim is P.cols.

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> G: array<vec4<f32>>;

var<workgroup> red: array<f32, 256>;
var<workgroup> norm_scale: f32;

fn prepare(li: u32) {
    var s = 0.0;
    for (var i = li; i < p.cols; i += 256u) {
        let v = X[i / 4u][i % 4u];
        s = fma(v, v, s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var st = 128u; st > 0u; st = st >> 1u) {
        if (li < st) {
            red[li] = red[li] + red[li + st];
        }
        workgroupBarrier();
    }
    if (li == 0u) {
        norm_scale = 1.0 / sqrt(red[0] / f32(p.cols) + bitcast<f32>(p.eps));
    }
    workgroupBarrier();
}

fn xv(c: u32, k: u32) -> vec4<f32> {
    let i = c * 8u + k;
    return X[i] * norm_scale * G[i];
}
