// mvq_x_stage.wgsl — x source of matvec_q8.wgsl: the f32 input, quantized by every workgroup into
// workgroup memory (`prepare`), so that no rmsnorm_q8 / quantize_q8 dispatch runs before the
// matmul. The Q8 row is the very one rmsnorm_q8.wgsl writes: X * scale * G (rms_scale.wgsl, same
// order), then q8_coop. (The layer runner stages the q|k|v input only: plan.rs says why.)
// Prepended: q8_act.wgsl, mvq_x_put.wgsl (XS, put_q8, xq), rms_scale.wgsl.
//   2 storage read  XF: array<vec4<f32>>  [P.cols / 4] the residual stream (plain layout)
//   4 storage read  G: array<vec4<f32>>   [P.cols / 4] the norm weight
// P.eps: the norm's eps as f32 bits. P.cols / 32 * 3 <= XS_WORDS.

@group(0) @binding(2) var<storage, read> XF: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> G: array<vec4<f32>>;

fn rms_x(j: u32) -> vec4<f32> {
    return XF[j];
}

fn prepare(li: u32) {
    let nv = p.cols / 32u * 8u;
    let scale = rms_scale(li, 0u, p.cols, bitcast<f32>(p.eps));
    for (var j0 = 0u; j0 < nv; j0 += 256u) {
        let j = j0 + li;
        var v = vec4<f32>(0.0);
        if (j < nv) {
            v = XF[j] * scale * G[j];
        }
        put_q8(li, j, nv, v);
    }
    workgroupBarrier();
}
