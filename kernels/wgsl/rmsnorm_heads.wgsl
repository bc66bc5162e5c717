// rmsnorm_heads.wgsl — the per-head RMSNorm of q and k in place (Qwen3's and Gemma 3's q/k
// norms), after the q|k|v matmul and before RoPE: in each fused q|k|v row, head h (the query
// heads 0 .. n_q, then the key heads) becomes X[h] * (1 / sqrt(mean(X[h]^2) + eps)) * G, with the
// q norm weight for query heads and the k norm weight for key heads; the values stay untouched.
// Composed as rms_scale.wgsl + this file (rmsnorm.wgsl's reduction order: a token's bits do not
// depend on the batch or on the plan that ran it).
//
// Bindings (group 0):
//   0 uniform P { dim (head_dim, a multiple of 4, at most 1024), n_tok, eps (f32), row (q|k|v row
//                 width / 4), n_q (query heads) }
//   1 storage rw    X: array<vec4<f32>>  [n_tok, row] fused q|k|v rows
//   2 storage read  G: array<vec4<f32>>  [2, dim / 4] q norm weight, then k norm weight
// Dispatch: (n_tok, n_q + n_kv, 1) workgroups of 256: workgroup (t, h) normalizes head h of token t.

struct P {
    dim: u32,
    n_tok: u32,
    eps: f32,
    row: u32,
    n_q: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> G: array<vec4<f32>>;

fn rms_x(j: u32) -> vec4<f32> {
    return X[j];
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let d4 = p.dim / 4u;
    let base = wg.x * p.row + wg.y * d4;
    // every read of the head is before rms_scale's first barrier, every write after its last
    let scale = rms_scale(li, base, p.dim, p.eps);
    var g = 0u;
    if (wg.y >= p.n_q) {
        g = d4;
    }
    for (var j = li; j < d4; j += 256u) {
        X[base + j] = X[base + j] * scale * G[g + j];
    }
}
