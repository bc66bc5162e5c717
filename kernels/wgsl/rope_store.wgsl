// rope_store.wgsl — for the tokens of one sequence in a layer runner step: rotary embedding of
// the query heads (in place) and key heads, then the rotated keys and the values stored into the
// sequence's KV cache. One dispatch replaces rope.wgsl + kv_store.wgsl in the layer runner; the
// arithmetic per value is the same as theirs (rope_pair.wgsl, prepended, then f16 rounding by
// pack2x16float or f32 bits), and the same as attention_one.wgsl's, which does this itself for a
// sequence of one token (decode), so that a token's bits do not depend on the path.
//
// Bindings (group 0):
//   0 uniform SeqP (seq_params.wgsl, prepended with kv_put.wgsl; dynamic offset: the sequence's slot)
//   1 storage rw    X: array<f32>    [t0 + n_tok, q_stride] fused q|k|v rows: query heads at 0,
//                                    key heads at n_head * head_dim, value heads after them
//   2 storage read  CS: array<f32>   [n_pos, head_dim / 2, 2] (cos, sin), as ops::rope_table
//   3 storage read  POS: array<u32>  [t0 + n_tok] position of each token (< n_pos and < capacity,
//                                    checked by the host)
//   4 storage rw    KC: array<u32>   [n_kv_head, capacity, head_dim] f16 pairs or f32 bits
//   5 storage rw    VC: array<u32>   same layout
// Dispatch: one thread per (token, pair of a q, k or v head), 256 per workgroup, workgroups
// (x, y) with linear index y * num_workgroups.x + x.

@group(0) @binding(0) var<uniform> p: SeqP;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<f32>;
@group(0) @binding(3) var<storage, read> POS: array<u32>;
@group(0) @binding(4) var<storage, read_write> KC: array<u32>;
@group(0) @binding(5) var<storage, read_write> VC: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    let half = p.head_dim / 2u;
    let per_tok = (p.n_head + 2u * p.n_kv_head) * half;
    if (i >= p.n_tok * per_tok) {
        return;
    }
    let t = p.t0 + i / per_tok;
    let k = i % per_tok; // head * half + pair, over the q, k and v heads
    let head = k / half;
    let pr = k % half;
    let x = t * p.q_stride + 2u * k;
    let pos = POS[t];
    let x0 = X[x];
    let x1 = X[x + 1u];
    if (head >= p.n_head + p.n_kv_head) {
        let vh = head - p.n_head - p.n_kv_head;
        kv_put(p.kv_f16 != 0u, true, (vh * p.capacity + pos) * p.head_dim + 2u * pr, x0, x1);
        return;
    }
    let cs = pos * p.head_dim + 2u * pr;
    let c = CS[cs];
    let s = CS[cs + 1u];
    let r = rope_pair(x0, x1, c, s);
    if (head < p.n_head) {
        X[x] = r.x;
        X[x + 1u] = r.y;
    } else {
        let kh = head - p.n_head;
        kv_put(p.kv_f16 != 0u, false, (kh * p.capacity + pos) * p.head_dim + 2u * pr, r.x, r.y);
    }
}
