// rope.wgsl — rotary embedding of every head, in place, in either of GGML's pairings:
//   neox = 0: adjacent pairs (x[2i], x[2i+1]), GGML "normal" mode (Llama); every pair of the head
//             (pairs from rope_dims / 2 on have (cos, sin) = (1, 0) in the table)
//   neox = 1: halves (x[i], x[i + rope_dims/2]) for i < rope_dims / 2, GGML's NeoX mode (Qwen,
//             Gemma, Phi-3); dimensions from rope_dims on are not touched
//
// Bindings (group 0):
//   0 uniform P { n_tok, n_head, head_dim, stride, rope_dims, neox, _, _ }
//   1 storage rw    X: array<f32>    [n_tok, stride]; heads 0..n_head are the first n_head * head_dim
//                                    values of each row (the layer runner ropes the query and key
//                                    heads of its fused q|k|v rows in one dispatch)
//   2 storage read  CS: array<f32>   [n_pos, head_dim / 2, 2] (cos, sin), as ops::rope_table; pair
//                                    i uses entry i in both modes
//   3 storage read  POS: array<u32>  [n_tok] position of each token (< n_pos, checked by the host)
// Dispatch: one thread per (token, head, pair): n_tok * n_head * (head_dim / 2) threads (neox = 0)
// or n_tok * n_head * (rope_dims / 2) (neox = 1), 256 per workgroup, workgroups (x, y) with linear
// index y * num_workgroups.x + x. (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos) as rope_pair.wgsl
// (prepended) computes it.

struct P {
    n_tok: u32,
    n_head: u32,
    head_dim: u32,
    stride: u32,
    rope_dims: u32,
    neox: u32,
    _a: u32,
    _b: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;
@group(0) @binding(3) var<storage, read> POS: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    let half = select(p.head_dim, p.rope_dims, p.neox != 0u) / 2u;
    let per_tok = p.n_head * half;
    if (i >= p.n_tok * per_tok) {
        return;
    }
    let t = i / per_tok;
    let k = i % per_tok; // head * half + pair
    let pair = k % half;
    // the pair's two elements: adjacent, or half a rotated span apart
    var x = t * p.stride + 2u * k;
    var y = x + 1u;
    if (p.neox != 0u) {
        x = t * p.stride + (k / half) * p.head_dim + pair;
        y = x + half;
    }
    let cs = POS[t] * p.head_dim + 2u * pair;
    let c = CS[cs];
    let s = CS[cs + 1u];
    let r = rope_pair(X[x], X[y], c, s);
    X[x] = r.x;
    X[y] = r.y;
}
