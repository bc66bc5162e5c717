// rmsnorm.wgsl — Y[t, :] = X[t, :] * (1 / sqrt(mean(X[t, :]^2) + eps)) * G. Composed as
// rms_scale.wgsl (P, bindings 0-2, the scale) + this file.
//
// Bindings (group 0): 0-2 see rms_scale.wgsl;
//   3 storage rw    Y: array<f32>  [n_tok, dim]; swizzle = 1 (the layer runner, dim a multiple of 32):
//                                  each row in matmul.wgsl's chunk-major layout (element 32c + 4k + i
//                                  at 4 * (k * dim / 32 + c) + i), else as X
// Dispatch: (n_tok, 1, 1) workgroups of 256, one per token.

@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.dim;
    let scale = rms_scale(li, base);
    for (var i = li; i < p.dim; i += 256u) {
        var o = i;
        if (p.swizzle != 0u) {
            o = (((i >> 2u) & 7u) * (p.dim >> 5u) + (i >> 5u)) * 4u + (i & 3u);
        }
        Y[base + o] = X[base + i] * scale * G[i];
    }
}
