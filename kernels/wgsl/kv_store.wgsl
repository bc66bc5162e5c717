// kv_store.wgsl — appends a batch's keys and values to one layer's KV cache.
//
// Bindings (group 0):
//   0 uniform P { n_tok, n_kv_head, head_dim, capacity, kv_f16, stride, k_off, v_off }
//   1 storage read  K: array<f32>   [n_tok, stride]; token t's keys (RoPE applied) at t * stride + k_off
//   2 storage read  V: array<f32>   [n_tok, stride]; its values at t * stride + v_off (K and V may be
//                                    the same buffer: the layer runner's fused q|k|v rows)
//   3 storage rw    KC: array<u32>  [n_kv_head, capacity, head_dim] as f16 pairs (kv_f16 = 1,
//                                    one word per 2 elements) or f32 bits (kv_f16 = 0)
//   4 storage rw    VC: array<u32>  same layout as KC
//   5 storage read  POS: array<u32> [n_tok] position of each token (< capacity)
// Dispatch: one thread per (token, kv head, element pair), 256 per workgroup, workgroups (x, y)
// with linear index y * num_workgroups.x + x. f16 conversion rounds to nearest (pack2x16float).

struct P {
    n_tok: u32,
    n_kv_head: u32,
    head_dim: u32,
    capacity: u32,
    kv_f16: u32,
    stride: u32,
    k_off: u32,
    v_off: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> K: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> KC: array<u32>;
@group(0) @binding(4) var<storage, read_write> VC: array<u32>;
@group(0) @binding(5) var<storage, read> POS: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    let half = p.head_dim / 2u;
    let per_tok = p.n_kv_head * half;
    if (i >= p.n_tok * per_tok) {
        return;
    }
    let t = i / per_tok;
    let k = i % per_tok; // kv head * half + pair
    let h = k / half;
    let ks = t * p.stride + p.k_off + 2u * k;
    let vs = t * p.stride + p.v_off + 2u * k;
    let dst = (h * p.capacity + POS[t]) * p.head_dim + 2u * (k % half);
    if (p.kv_f16 != 0u) {
        KC[dst / 2u] = pack2x16float(vec2<f32>(K[ks], K[ks + 1u]));
        VC[dst / 2u] = pack2x16float(vec2<f32>(V[vs], V[vs + 1u]));
    } else {
        KC[dst] = bitcast<u32>(K[ks]);
        KC[dst + 1u] = bitcast<u32>(K[ks + 1u]);
        VC[dst] = bitcast<u32>(V[vs]);
        VC[dst + 1u] = bitcast<u32>(V[vs + 1u]);
    }
}
