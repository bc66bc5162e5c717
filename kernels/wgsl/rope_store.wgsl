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
// RoPE pairs: adjacent (x[2i], x[2i+1]), or with SeqP.neox = 1 the halves (x[i], x[i + head_dim/2])
// (GGML's NeoX mode, every dimension rotated). Then the thread of pair pr < head_dim/4 of a q or
// k head rotates two NeoX pairs, (2pr, 2pr + half) and (2pr + 1, 2pr + 1 + half), so that it
// writes two whole (f16-pair) words of the cache, and the threads of the other pairs of the head
// have nothing to do; value heads are copied in adjacent pairs either way.
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
    if (p.neox != 0u) {
        if (2u * pr >= half) {
            return;
        }
        // elements e, e + 1 and their partners e + half, e + 1 + half (e = 2 pr; half is even)
        let e = 2u * pr;
        let xb = t * p.q_stride + head * p.head_dim;
        let y0 = X[xb + e + half];
        let y1 = X[xb + e + 1u + half];
        let ca = pos * p.head_dim + 2u * e;
        let ra = rope_pair(x0, y0, CS[ca], CS[ca + 1u]);
        let rb = rope_pair(x1, y1, CS[ca + 2u], CS[ca + 3u]);
        if (head < p.n_head) {
            X[x] = ra.x;
            X[x + 1u] = rb.x;
            X[xb + e + half] = ra.y;
            X[xb + e + 1u + half] = rb.y;
        } else {
            let kb = ((head - p.n_head) * p.capacity + pos) * p.head_dim;
            kv_put(p.kv_f16 != 0u, false, kb + e, ra.x, rb.x);
            kv_put(p.kv_f16 != 0u, false, kb + e + half, ra.y, rb.y);
        }
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
