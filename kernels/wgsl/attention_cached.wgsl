// attention_cached.wgsl — prefix of attention.wgsl for `attention`: queries with RoPE applied in
// Q, every key and value read from the cache (bindings in attention.wgsl's header).

@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> KC: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> VC: array<u32>;
@group(0) @binding(6) var<storage, read_write> Q8O: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read_write> S: array<f32>;

fn load_query(h: u32, t: u32, kvh: u32, li: u32) {
    let qoff = t * p.q_stride + h * p.head_dim;
    for (var d = li; d < p.head_dim; d += 256u) {
        qv[d] = Q[qoff + d];
    }
}

fn key_dot(kb: u32) -> f32 {
    return cache_dot(kb);
}

fn value(e: u32) -> vec2<f32> {
    return v_pair(e);
}
