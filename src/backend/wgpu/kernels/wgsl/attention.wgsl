// attention.wgsl — causal attention of a batch of query tokens of one sequence over its KV cache.
//
// Bindings (group 0):
//   0 uniform P { n_tok, n_head, n_kv_head, head_dim, capacity, kv_f16, scale (f32), q_stride }
//   1 storage read  Q: array<f32>   [n_tok, q_stride]; the first n_head * head_dim values of a row
//                                    are the token's query heads (RoPE applied)
//   2 storage read  KC: array<u32>  [n_kv_head, capacity, head_dim], f16 pairs (kv_f16 = 1) or f32 bits
//   3 storage read  VC: array<u32>  same layout as KC
//   4 storage read  POS: array<u32> [n_tok] position of each query; it attends to keys 0..=POS[t]
//   5 storage rw    O: array<f32>   [n_tok, n_head * head_dim]
// Dispatch: (n_head, n_tok, 1) workgroups of 64 threads, one per (head, token); head_dim <= 256
// and even. Query head h reads KV head h / (n_head / n_kv_head).
//
// Keys are scanned in position order in tiles of 64 at absolute positions 0, 64, 128, ...: thread
// j scores key tile+j (a fused multiply-add chain over head_dim), the tile's max and sum of
// exponentials come from fixed trees, and each output dimension accumulates the tile's values in
// key order (online softmax, as ops::attend_head; the loops are unrolled by hand so that loads
// issue together, the order of the additions is unchanged). Nothing depends on the other queries
// of the batch, so a token's output is bitwise the same in decode and prefill.

struct P {
    n_tok: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    capacity: u32,
    kv_f16: u32,
    scale: f32,
    q_stride: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> KC: array<u32>;
@group(0) @binding(3) var<storage, read> VC: array<u32>;
@group(0) @binding(4) var<storage, read> POS: array<u32>;
@group(0) @binding(5) var<storage, read_write> O: array<f32>;

const AT: u32 = 64u;
const NEG: f32 = -3.0e38; // stands for -infinity (WGSL may assume no infinities)

// [head_dim] the query
var<workgroup> qv: array<f32, 256>;
// [AT] exp(score - max) of the current tile
var<workgroup> es: array<f32, 64>;
// [AT] reduction scratch
var<workgroup> red: array<f32, 64>;
// key count, shared so that loop bounds are workgroup-uniform
var<workgroup> nkeys: u32;

// Elements (e, e + 1) of a cache buffer, e even.
fn k_pair(e: u32) -> vec2<f32> {
    if (p.kv_f16 != 0u) {
        return unpack2x16float(KC[e >> 1u]);
    }
    return vec2<f32>(bitcast<f32>(KC[e]), bitcast<f32>(KC[e + 1u]));
}

fn v_at(e: u32) -> f32 {
    if (p.kv_f16 != 0u) {
        return unpack2x16float(VC[e >> 1u])[e & 1u];
    }
    return bitcast<f32>(VC[e]);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = wg.y;
    let hd = p.head_dim;
    let kvh = h / (p.n_head / p.n_kv_head);
    let qoff = t * p.q_stride + h * hd;
    let ooff = (t * p.n_head + h) * hd;
    for (var d = tid; d < hd; d += AT) {
        qv[d] = Q[qoff + d];
    }
    if (tid == 0u) {
        nkeys = POS[t] + 1u;
    }
    // Every lane's query element is written before any lane reads the whole query.
    workgroupBarrier();
    let n_keys = workgroupUniformLoad(&nkeys);
    let kv0 = kvh * p.capacity;
    var m = NEG;
    var l = 0.0;
    var o: array<f32, 4>; // output dims tid, tid + 64, tid + 128, tid + 192
    for (var start = 0u; start < n_keys; start += AT) {
        let j = start + tid;
        var s = NEG;
        if (j < n_keys) {
            let kb = (kv0 + j) * hd;
            var dot = 0.0;
            var d = 0u;
            for (; d + 8u <= hd; d += 8u) {
                let k0 = k_pair(kb + d);
                let k1 = k_pair(kb + d + 2u);
                let k2 = k_pair(kb + d + 4u);
                let k3 = k_pair(kb + d + 6u);
                dot = fma(qv[d], k0.x, dot);
                dot = fma(qv[d + 1u], k0.y, dot);
                dot = fma(qv[d + 2u], k1.x, dot);
                dot = fma(qv[d + 3u], k1.y, dot);
                dot = fma(qv[d + 4u], k2.x, dot);
                dot = fma(qv[d + 5u], k2.y, dot);
                dot = fma(qv[d + 6u], k3.x, dot);
                dot = fma(qv[d + 7u], k3.y, dot);
            }
            for (; d < hd; d += 2u) {
                let k0 = k_pair(kb + d);
                dot = fma(qv[d], k0.x, dot);
                dot = fma(qv[d + 1u], k0.y, dot);
            }
            s = dot * p.scale;
        }
        red[tid] = s;
        workgroupBarrier();
        for (var st = AT / 2u; st > 0u; st = st >> 1u) {
            if (tid < st) {
                red[tid] = max(red[tid], red[tid + st]);
            }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        let corr = exp(m - m_new);
        var e = 0.0;
        if (j < n_keys) {
            e = exp(s - m_new);
        }
        es[tid] = e;
        red[tid] = e;
        workgroupBarrier();
        for (var st = AT / 2u; st > 0u; st = st >> 1u) {
            if (tid < st) {
                red[tid] = red[tid] + red[tid + st];
            }
            workgroupBarrier();
        }
        l = l * corr + red[0];
        let nk = min(AT, n_keys - start);
        for (var i = 0u; i < 4u; i++) {
            let d = tid + i * AT;
            if (d < hd) {
                var a = o[i] * corr;
                let vb = (kv0 + start) * hd + d;
                var jj = 0u;
                for (; jj + 4u <= nk; jj += 4u) {
                    let v0 = v_at(vb + jj * hd);
                    let v1 = v_at(vb + (jj + 1u) * hd);
                    let v2 = v_at(vb + (jj + 2u) * hd);
                    let v3 = v_at(vb + (jj + 3u) * hd);
                    a = fma(es[jj], v0, a);
                    a = fma(es[jj + 1u], v1, a);
                    a = fma(es[jj + 2u], v2, a);
                    a = fma(es[jj + 3u], v3, a);
                }
                for (; jj < nk; jj++) {
                    a = fma(es[jj], v_at(vb + jj * hd), a);
                }
                o[i] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    var inv = 0.0;
    if (l > 0.0) {
        inv = 1.0 / l;
    }
    for (var i = 0u; i < 4u; i++) {
        let d = tid + i * AT;
        if (d < hd) {
            O[ooff + d] = o[i] * inv;
        }
    }
}
