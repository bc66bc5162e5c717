// rmsnorm.wgsl — Y[t, :] = X[t, :] * (1 / sqrt(mean(X[t, :]^2) + eps)) * G.
//
// Bindings (group 0):
//   0 uniform P { dim, n_tok, eps (f32), swizzle }
//   1 storage read  X: array<f32>  [n_tok, dim]
//   2 storage read  G: array<f32>  [dim] weight
//   3 storage rw    Y: array<f32>  [n_tok, dim]; swizzle = 1 (the layer runner, dim a multiple of 32):
//                                  each row in matmul.wgsl's chunk-major layout (element 32c + 4k + i
//                                  at 4 * (k * dim / 32 + c) + i), else as X
// Dispatch: (n_tok, 1, 1) workgroups of 256, one per token. Thread i sums the squares of elements
// i, i+256, ... in order (fused multiply-add), then a fixed tree adds the 256 partial sums: a
// token's result does not depend on the batch.

struct P {
    dim: u32,
    n_tok: u32,
    eps: f32,
    swizzle: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let base = wg.x * p.dim;
    var s = 0.0;
    for (var i = li; i < p.dim; i += 256u) {
        let v = X[base + i];
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
    let scale = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += 256u) {
        var o = i;
        if (p.swizzle != 0u) {
            o = (((i >> 2u) & 7u) * (p.dim >> 5u) + (i >> 5u)) * 4u + (i & 3u);
        }
        Y[base + o] = X[base + i] * scale * G[i];
    }
}
