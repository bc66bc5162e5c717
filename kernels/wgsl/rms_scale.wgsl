// rms_scale.wgsl — what rmsnorm.wgsl and rmsnorm_q8.wgsl share (prepended to each): the
// parameters, bindings 0-2 and the per-token scale.
//   0 uniform P { dim (a multiple of 4), n_tok, eps (f32), swizzle }
//   1 storage read  X: array<vec4<f32>>  [n_tok, dim / 4]
//   2 storage read  G: array<vec4<f32>>  [dim / 4] weight
// rms_scale(li, base) = 1 / sqrt(mean(X row^2) + eps) for the row starting at vec4 `base`, by a
// workgroup of 256: thread i sums the squares of vec4s i, i+256, ... in order (fused
// multiply-adds, components x, y, z, w), then a fixed tree adds the 256 partial sums: a token's
// result does not depend on the batch. Every invocation of the workgroup calls it (barriers).

struct P {
    dim: u32,
    n_tok: u32,
    eps: f32,
    swizzle: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> G: array<vec4<f32>>;

var<workgroup> red: array<f32, 256>;

fn rms_scale(li: u32, base: u32) -> f32 {
    var s = 0.0;
    for (var j = li; j < p.dim / 4u; j += 256u) {
        let v = X[base + j];
        s = fma(v.x, v.x, s);
        s = fma(v.y, v.y, s);
        s = fma(v.z, v.z, s);
        s = fma(v.w, v.w, s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var st = 128u; st > 0u; st = st >> 1u) {
        if (li < st) {
            red[li] = red[li] + red[li + st];
        }
        workgroupBarrier();
    }
    return 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
}
