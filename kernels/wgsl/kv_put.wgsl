// kv_put.wgsl — a rotated key pair or a value pair stored into a sequence's cache, shared by
// rope_store.wgsl and mv_y_rope.wgsl (prepended; they declare KC and VC as array<u32>, layout
// [n_kv_head, capacity, head_dim]): (a, b) at element dst (even), as an f16 pair by pack2x16float
// (f16 = true) or as f32 bits.

fn kv_put(f16: bool, is_v: bool, dst: u32, a: f32, b: f32) {
    if (f16) {
        let w = pack2x16float(vec2<f32>(a, b));
        if (is_v) {
            VC[dst / 2u] = w;
        } else {
            KC[dst / 2u] = w;
        }
    } else if (is_v) {
        VC[dst] = bitcast<u32>(a);
        VC[dst + 1u] = bitcast<u32>(b);
    } else {
        KC[dst] = bitcast<u32>(a);
        KC[dst + 1u] = bitcast<u32>(b);
    }
}
