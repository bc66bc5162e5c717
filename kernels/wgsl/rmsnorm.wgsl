// rmsnorm.wgsl — Y[t, :] = X[t, :] * (1 / sqrt(mean(X[t, :]^2) + eps)) * G, or with add = 1
// Y[t, :] += that (Gemma's post-attention and post-FFN norms: X the projection's output, Y the
// residual stream, the CPU engine's x + rmsnorm(proj) in its order). Composed as
// rms_bind.wgsl (P, bindings 0-2) + rms_scale.wgsl + this file.
//
// Bindings (group 0): 0-2 see rms_bind.wgsl;
//   3 storage rw    Y: array<vec4<f32>>  [n_tok, dim / 4]; swizzle = 1 (the layer runner, dim a
//                                        multiple of 32): each row in the f32 matmul input's (mm_x_f32.wgsl) chunk-major
//                                        layout (vec4 k of chunk c at k * dim / 32 + c), else as X
// Dispatch: (n_tok, ceil(dim / 1024), 1) workgroups of 256: workgroup (t, y) computes token t's
// scale and writes its vec4s 256 y .. 256 y + 255 (every workgroup of a token the same scale).

@group(0) @binding(3) var<storage, read_write> Y: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let d4 = p.dim / 4u;
    let base = wg.x * d4;
    let scale = rms_scale(li, base, p.dim, p.eps);
    let end = min(d4, (wg.y + 1u) * 256u);
    for (var j = wg.y * 256u + li; j < end; j += 256u) {
        var o = j;
        if (p.swizzle != 0u) {
            o = (j % 8u) * (p.dim / 32u) + j / 8u;
        }
        let v = X[base + j] * scale * G[j];
        if (p.add != 0u) {
            Y[base + o] = Y[base + o] + v;
        } else {
            Y[base + o] = v;
        }
    }
}
