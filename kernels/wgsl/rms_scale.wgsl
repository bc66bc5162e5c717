// rms_scale.wgsl — the RMSNorm scale, shared by rmsnorm.wgsl, rmsnorm_q8.wgsl and the decode
// matmul's staged input (mvq_x_stage.wgsl); the including kernel defines `rms_x(j)`, vec4 j of
// the row.
// rms_scale(li, base, dim, eps) = 1 / sqrt(mean(row^2) + eps) for the row of `dim` values (a
// multiple of 4) starting at vec4 `base`, by a workgroup of 256: thread i sums the squares of
// vec4s i, i+256, ... in order (fused multiply-adds, components x, y, z, w), then a fixed tree adds
// the 256 partial sums: a token's result does not depend on the batch or on the kernel. Every
// invocation of the workgroup calls it (barriers).

var<workgroup> red: array<f32, 256>;

fn rms_scale(li: u32, base: u32, dim: u32, eps: f32) -> f32 {
    var s = 0.0;
    for (var j = li; j < dim / 4u; j += 256u) {
        let v = rms_x(base + j);
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
    return 1.0 / sqrt(red[0] / f32(dim) + eps);
}
