// mv_y_rope.wgsl — `finish` of matmul_vec.wgsl for the fused q|k|v matrix of a step of one token
// (decode) with rope_store.wgsl's work as the epilogue: RoPE of the query and key heads, the
// rotated keys and the values stored into the sequence's KV cache, so that no rope_store
// dispatch runs. Rows 2k and 2k + 1 (pair k over the q, k and v heads, rope_store.wgsl's
// numbering) sit in one workgroup (ROWS even, a workgroup's first row even); their sums meet in
// workgroup memory and lane 0 of row 2k rotates and stores them with rope_store.wgsl's
// expressions on the very bits the plain store would have written: the same bits as
// matvec + rope_store. Query rows go to Y[y_off + r] (rotated, where attention.wgsl reads them);
// key and value rows only to the cache (kv_put.wgsl). Composed after rope_pair.wgsl,
// seq_params.wgsl and kv_put.wgsl; called by every invocation (it holds a workgroup barrier).
//
// Bindings of its own (group 0; 0-4 as matmul_vec.wgsl with mvq_x_stage.wgsl):
//   5 storage rw    KC: array<u32>   [n_kv_head, capacity, head_dim] f16 pairs or f32 bits
//   6 storage rw    VC: array<u32>   same layout
//   7 storage read  CS: array<f32>   [n_pos, head_dim / 2, 2] (cos, sin)
//   8 storage read  POS: array<u32>  [t0 + 1] the token's position at POS[t0]
//   9 uniform SeqP (seq_params.wgsl; dynamic offset: the sequence's slot; n_tok = 1)

@group(0) @binding(5) var<storage, read_write> KC: array<u32>;
@group(0) @binding(6) var<storage, read_write> VC: array<u32>;
@group(0) @binding(7) var<storage, read> CS: array<f32>;
@group(0) @binding(8) var<storage, read> POS: array<u32>;
@group(0) @binding(9) var<uniform> sp: SeqP;

var<workgroup> pair_sum: array<f32, ROWS>;

fn finish(r: u32, j: u32, lane: u32, v: f32) {
    if (lane == 0u) {
        pair_sum[j] = v;
    }
    workgroupBarrier();
    if (lane != 0u || (j & 1u) != 0u || r + 1u >= p.rows) {
        return;
    }
    let x0 = pair_sum[j];
    let x1 = pair_sum[j + 1u];
    let half = sp.head_dim / 2u;
    let k = r >> 1u;
    let head = k / half;
    let pr = k % half;
    let pos = POS[sp.t0];
    if (head >= sp.n_head + sp.n_kv_head) {
        let vh = head - sp.n_head - sp.n_kv_head;
        kv_put(sp.kv_f16 != 0u, true, (vh * sp.capacity + pos) * sp.head_dim + 2u * pr, x0, x1);
        return;
    }
    let cs = pos * sp.head_dim + 2u * pr;
    let rot = rope_pair(x0, x1, CS[cs], CS[cs + 1u]);
    if (head < sp.n_head) {
        Y[p.y_off + r] = rot.x;
        Y[p.y_off + r + 1u] = rot.y;
    } else {
        kv_put(sp.kv_f16 != 0u, false, ((head - sp.n_head) * sp.capacity + pos) * sp.head_dim + 2u * pr, rot.x, rot.y);
    }
}
