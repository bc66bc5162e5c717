// rmsnorm_q8.wgsl — RMSNorm written as Q8 rows (the input of the integer-dot matmuls): the values
// rmsnorm.wgsl writes (X * scale * G, the same expression on the same scale), quantized by
// q8_coop. Composed as q8_act.wgsl + rms_bind.wgsl (P, bindings 0-2) + rms_scale.wgsl + this file.
//
// Bindings (group 0): 0-2 see rms_bind.wgsl (P.swizzle ignored; dim a multiple of 32);
//   3 storage rw    Y: array<vec4<u32>>  [n_tok] Q8 rows (3 * dim / 32 words each, q8_act.wgsl)
// Dispatch: (n_tok, ceil(dim / 1024), 1) workgroups of 256: workgroup (t, y) computes token t's
// scale and quantizes its vec4s 256 y + li (blocks 32 y .. 32 y + 31), one round of q8_coop.

@group(0) @binding(3) var<storage, read_write> Y: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.dim / 4u;
    let scale = rms_scale(li, base, p.dim, p.eps);
    let nc = p.dim / 32u;
    let yb = wg.x * 3u * nc;
    let end = min(nc * 8u, (wg.y + 1u) * 256u);
    for (var j0 = wg.y * 256u; j0 < end; j0 += 256u) {
        let j = j0 + li;
        let live = j < nc * 8u;
        var v = vec4<f32>(0.0);
        if (live) {
            v = X[base + j] * scale * G[j];
        }
        let q = q8_coop(li, v);
        if (live) {
            let b = j / 8u;
            let k = j % 8u;
            Y[yb + 2u * b + k / 4u][k % 4u] = q.word;
            if (k == 0u) {
                Y[yb + 2u * nc + b] = q.sums;
            }
        }
    }
}
