// attention_one.wgsl — prefix of attention.wgsl (after rope_pair.wgsl) for `attention_one`: one
// token of a sequence (decode), RoPE and the KV store done here instead of by rope_store.wgsl
// (bindings in attention.wgsl's header). Thread i < head_dim / 2 of the workgroup of query head h
// ropes pair i of that head into `qv`, ropes pair i of the key of KV head kvh and takes pair i of
// its value (the token's raw q|k|v row X), rounds both as the cache holds them (f16 by
// pack2x16float and back through an opaque zero, or f32) into `kown` / `vown`, and when h is the first query head of its KV group
// stores them at position POS[t] of the cache, bitwise as rope_store.wgsl would. Scores and
// values of that position come from `kown` / `vown` in every workgroup of the group: the cache
// slot being written is never read in this dispatch.

@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> KC: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> VC: array<u32>;
@group(0) @binding(6) var<storage, read> CS: array<f32>;
@group(0) @binding(7) var<storage, read_write> Q8O: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> S: array<f32>;

// [head_dim] the token's key and value of this KV head, as the cache holds them
var<workgroup> kown: array<f32, 256>;
var<workgroup> vown: array<f32, 256>;
// element of KC / VC where the token's key and value start
var<private> own: u32;

fn load_query(h: u32, t: u32, kvh: u32, li: u32) {
    let hd = p.head_dim;
    let pos = POS[t];
    own = (kvh * p.capacity + pos) * hd;
    if (li >= hd / 2u) {
        return;
    }
    let d = 2u * li;
    let c = CS[pos * hd + d];
    let s = CS[pos * hd + d + 1u];
    let row = t * p.q_stride + d;
    let q = rope_pair(X[row + h * hd], X[row + h * hd + 1u], c, s);
    qv[d] = q.x;
    qv[d + 1u] = q.y;
    let kx = row + (p.n_head + kvh) * hd;
    var k = rope_pair(X[kx], X[kx + 1u], c, s);
    let vx = row + (p.n_head + p.n_kv_head + kvh) * hd;
    var v = vec2<f32>(X[vx], X[vx + 1u]);
    // one writer per KV head: the group's first query head (its chunk 0 when split)
    let writer = h % (p.n_head / p.n_kv_head) == 0u && chunk_z == 0u;
    let e = own + d;
    if (p.kv_f16 != 0u) {
        let kw = pack2x16float(k);
        let vw = pack2x16float(v);
        // P._c is always 0: OR-ing it in keeps the round trip opaque to the compiler (NVIDIA's
        // folds unpack2x16float(pack2x16float(x)) to x, which left these values unrounded).
        k = unpack2x16float(kw | p._c);
        v = unpack2x16float(vw | p._c);
        if (writer) {
            KC[e >> 3u][(e >> 1u) & 3u] = kw;
            VC[e >> 1u] = vw;
        }
    } else if (writer) {
        KC[e >> 2u][e & 3u] = bitcast<u32>(k.x);
        KC[e >> 2u][(e & 3u) + 1u] = bitcast<u32>(k.y);
        VC[e] = bitcast<u32>(v.x);
        VC[e + 1u] = bitcast<u32>(v.y);
    }
    kown[d] = k.x;
    kown[d + 1u] = k.y;
    vown[d] = v.x;
    vown[d + 1u] = v.y;
}

// The token's own key from `kown`, in cache_dot's order (one fused multiply-add chain over d).
fn key_dot(kb: u32) -> f32 {
    if (kb != own) {
        return cache_dot(kb);
    }
    var dot = 0.0;
    for (var d = 0u; d < p.head_dim; d++) {
        dot = fma(qv[d], kown[d], dot);
    }
    return dot;
}

fn value(e: u32) -> vec2<f32> {
    let o = e - own;
    if (o < p.head_dim) {
        return vec2<f32>(vown[o], vown[o + 1u]);
    }
    return v_pair(e);
}
