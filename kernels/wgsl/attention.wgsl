// attention.wgsl — causal attention of the query tokens of one sequence over its KV cache, keys
// in chunks of 256 (attention_part.wgsl), each chunk split over the 8 groups of a workgroup. The
// body of two kernels, each after q8_act.wgsl (q8_coop), seq_params.wgsl, attention_part.wgsl and
// a prefix that declares bindings 1..3, 6 and 7 (and 8) and three hooks:
// `load_query` (fill `qv` with the workgroup's query head), `key_dot` (q · key j) and `value`
// (a pair of value j):
// * attention_cached.wgsl — `attention`: the queries' RoPE is done and every key and value is
//   in the cache (rope_store.wgsl ran before); prefill, decode, and the op of WgpuBackend.
// * attention_one.wgsl (after rope_pair.wgsl) — `attention_one`: a sequence of one token
//   (decode). The workgroup ropes its query head itself from the raw q|k|v row, computes its KV
//   head's key and value for the token's position, and the first query head of each KV group
//   (its chunk-0 workgroup when split) stores them into the cache (replacing rope_store.wgsl).
//
// Bindings (group 0):
//   0 uniform SeqP (seq_params.wgsl, prepended; dynamic offset: one slot per sequence of a step)
//   1 storage read  Q / X: array<f32>    [t0 + n_tok, q_stride]; the first n_head * head_dim values
//                                         of a row are the token's query heads (RoPE applied:
//                                         `attention`); attention_one: the raw fused q|k|v row
//                                         (as rope_store.wgsl's X)
//   2 storage KC: array<vec4<u32>>       [n_kv_head, capacity, head_dim], f16 pairs (kv_f16 = 1)
//                                         or f32 bits, read 16 bytes at a time (read_write in
//                                         attention_one, which stores position POS[t])
//   3 storage VC: array<u32>             same layout as KC, read one pair (2 values) at a time
//   4 storage read  POS: array<u32>      [t0 + n_tok] position of each query; it attends to 0..=POS[t]
//                                         (with a sliding window, SeqP.window = w > 0: to
//                                         max(0, POS[t] + 1 - w) ..= POS[t])
//   5 storage rw    O: array<f32>        [t0 + n_tok, n_head * head_dim]; swizzle = 1 (the layer
//                                         runner, n_head * head_dim a multiple of 32): each row in
//                                         the f32 matmul input's (mm_x_f32.wgsl) chunk-major layout (element 32c + 4k + i at
//                                         4 * (k * width / 32 + c) + i)
//   6 storage rw    Q8O: array<vec4<u32>> (`attention`; binding 7 in attention_one) [t0 + n_tok] Q8
//                                         rows of width n_head * head_dim (q8_act.wgsl), written when
//                                         q8_out = 1 (head_dim a multiple of 32): the output quantized
//                                         for the o projection's integer dot products, in addition to O
//   6 storage read  CS: array<f32>       attention_one only: [n_pos, head_dim / 2, 2] (cos, sin)
//   7 storage rw    S: array<f32>        (binding 8 in attention_one) the chunk partials of a split
//                                         dispatch (attention_part.wgsl)
// Rows t0 .. t0 + n_tok are this sequence's (attention_one: n_tok = 1). Head_dim a multiple of 8,
// at most 256; query head h reads KV head h / (n_head / n_kv_head). Dispatch, workgroups of 256
// threads: (n_head, n_tok), one per (head, token), each walking its token's chunks and writing O;
// or split (a sequence of one token, the grid taller than n_tok): (n_head, chunks of the
// capacity), one per (head, chunk), each storing its chunk's partial in S (workgroups past the
// token's keys return), then attention_merge.wgsl folds them and writes O.
//
// Order of the arithmetic (fixed, so a token's output is bitwise the same alone, in a prefill of
// any chunking, or next to other sequences, split or not, and in either kernel): keys are cut into
// tiles of 32 at absolute positions 0, 32, 64, ...; chunk c holds tiles 8c .. 8c + 7, and group g
// of the workgroup takes tile 8c + g. Lane j of a group scores key j of its tile (a fused
// multiply-add chain over head_dim, times `scale`). Every lane of the group then walks the tile's
// scores in key order: the tile's max m (a chain of max), and for each key e = exp(s - m),
// l += e, o += e * v (lane j owns value pairs j, j + 32, ...). The 8 groups' (m, l, o) are merged
// in group order 0..7 with exp(m_g - max_g m_g) into the chunk's partial, and the chunks'
// partials are folded in chunk order (attention_part.wgsl `fold`); the result is o / l. The 8
// groups load keys and values concurrently, and in decode the chunks run in parallel workgroups,
// which hides memory latency. attention_one's own key and value (position POS[t]) are used as computed,
// rounded as the cache holds them, and never read back from the cache: the other workgroups of
// the KV group would race with the one that stores them.
// A sliding window keeps the same tiles and chunks: chunks and tiles that end before the window's
// first key k0 are skipped, and in the tile holding k0 the keys before it score -inf (exp gives
// exactly 0 for them, since the tile's max is that of a key inside the window), so the arithmetic
// over the window's keys does not depend on the keys outside it.

const G: u32 = 8u;   // groups per workgroup
const L: u32 = 32u;  // lanes per group = keys per tile

// [head_dim] the query
var<workgroup> qv: array<f32, 256>;
// [G][256] each group's unnormalized output over its tile
var<workgroup> go: array<f32, 2048>;
// [G] each group's max and sum over its tile
var<workgroup> gm: array<f32, 8>;
var<workgroup> gl: array<f32, 8>;
// which chunk this workgroup takes (split dispatch; 0 otherwise)
var<private> chunk_z: u32;

// q · 8 key values (f16 pairs in w, or f32 bits in w0, w1) for elements d .. d + 7 of q,
// continuing `acc`: one fused multiply-add per element, in element order.
fn dot8h(acc: f32, w: vec4<u32>, d: u32) -> f32 {
    let a = unpack2x16float(w.x);
    let b = unpack2x16float(w.y);
    let c = unpack2x16float(w.z);
    let f = unpack2x16float(w.w);
    var s = fma(qv[d], a.x, acc);
    s = fma(qv[d + 1u], a.y, s);
    s = fma(qv[d + 2u], b.x, s);
    s = fma(qv[d + 3u], b.y, s);
    s = fma(qv[d + 4u], c.x, s);
    s = fma(qv[d + 5u], c.y, s);
    s = fma(qv[d + 6u], f.x, s);
    return fma(qv[d + 7u], f.y, s);
}

fn dot8f(acc: f32, w0: vec4<u32>, w1: vec4<u32>, d: u32) -> f32 {
    let a = bitcast<vec4<f32>>(w0);
    let b = bitcast<vec4<f32>>(w1);
    var s = fma(qv[d], a.x, acc);
    s = fma(qv[d + 1u], a.y, s);
    s = fma(qv[d + 2u], a.z, s);
    s = fma(qv[d + 3u], a.w, s);
    s = fma(qv[d + 4u], b.x, s);
    s = fma(qv[d + 5u], b.y, s);
    s = fma(qv[d + 6u], b.z, s);
    return fma(qv[d + 7u], b.w, s);
}

// q · 32 key values from word e of KC on, for elements d .. d + 31 of q, continuing `acc`
// (dot8h / dot8f in element order; the loads come first).
fn dot32h(acc: f32, e: u32, d: u32) -> f32 {
    let w0 = KC[e];
    let w1 = KC[e + 1u];
    let w2 = KC[e + 2u];
    let w3 = KC[e + 3u];
    return dot8h(dot8h(dot8h(dot8h(acc, w0, d), w1, d + 8u), w2, d + 16u), w3, d + 24u);
}

fn dot32f(acc: f32, e: u32, d: u32) -> f32 {
    let w0 = KC[e];
    let w1 = KC[e + 1u];
    let w2 = KC[e + 2u];
    let w3 = KC[e + 3u];
    let w4 = KC[e + 4u];
    let w5 = KC[e + 5u];
    let w6 = KC[e + 6u];
    let w7 = KC[e + 7u];
    return dot8f(dot8f(dot8f(dot8f(acc, w0, w1, d), w2, w3, d + 8u), w4, w5, d + 16u), w6, w7, d + 24u);
}

// q · the key whose elements start at element kb of KC (kb a multiple of 8): one fused
// multiply-add chain over the elements in order. 64 (f16) or 32 (f32) elements' loads are issued
// together (they do not depend on the chain; the order is that of one element at a time).
fn cache_dot(kb: u32) -> f32 {
    var dot = 0.0;
    var d = 0u;
    if (p.kv_f16 != 0u) {
        for (; d + 64u <= p.head_dim; d += 64u) {
            let e = (kb + d) >> 3u;
            dot = dot32h(dot32h(dot, e, d), e + 4u, d + 32u);
        }
        for (; d + 32u <= p.head_dim; d += 32u) {
            dot = dot32h(dot, (kb + d) >> 3u, d);
        }
        for (; d < p.head_dim; d += 8u) {
            dot = dot8h(dot, KC[(kb + d) >> 3u], d);
        }
    } else {
        for (; d + 32u <= p.head_dim; d += 32u) {
            dot = dot32f(dot, (kb + d) >> 2u, d);
        }
        for (; d < p.head_dim; d += 8u) {
            let e = (kb + d) >> 2u;
            dot = dot8f(dot, KC[e], KC[e + 1u], d);
        }
    }
    return dot;
}

// exp(sc[i .. i + 3] - m)
fn exp4(i: u32, m: f32) -> vec4<f32> {
    return exp(vec4<f32>(sc[i], sc[i + 1u], sc[i + 2u], sc[i + 3u]) - vec4<f32>(m));
}

// l + e.x + e.y + e.z + e.w, added in that order
fn sum4(l: f32, e: vec4<f32>) -> f32 {
    return l + e.x + e.y + e.z + e.w;
}

// o + the value pairs at r, r + hd, r + 2 hd, r + 3 hd weighted by e (keys in order, one fused
// multiply-add each).
fn acc4(o: vec2<f32>, r: u32, hd: u32, e: vec4<f32>) -> vec2<f32> {
    let a0 = value(r);
    let a1 = value(r + hd);
    let a2 = value(r + 2u * hd);
    let a3 = value(r + 3u * hd);
    return fma(vec2<f32>(e.w), a3, fma(vec2<f32>(e.z), a2, fma(vec2<f32>(e.y), a1, fma(vec2<f32>(e.x), a0, o))));
}

// Sixteen keys (acc4 four times, in key order): their loads do not depend on the additions, so
// they issue together.
fn acc16(o: vec2<f32>, r: u32, hd: u32, ea: vec4<f32>, eb: vec4<f32>, ec: vec4<f32>, ed: vec4<f32>) -> vec2<f32> {
    return acc4(acc4(acc4(acc4(o, r, hd, ea), r + 4u * hd, hd, eb), r + 8u * hd, hd, ec), r + 12u * hd, hd, ed);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = wg.x;
    // split: one token, one workgroup per (head, chunk): the grid's y is the chunk count
    let split = nwg.y > p.n_tok;
    var t = p.t0 + wg.y;
    if (split) {
        t = p.t0;
        chunk_z = wg.y;
    }
    let hd = p.head_dim;
    let g = li / L;
    let lane = li % L;
    let kvh = h / (p.n_head / p.n_kv_head);
    load_query(h, t, kvh, li);
    workgroupBarrier();
    let kr = key_range(t, li);
    let n_keys = kr.x;
    let k0 = kr.y;
    var c = kr.z;
    var c_end = kr.w;
    if (split) {
        if (chunk_z < c || chunk_z >= c_end) {
            return;
        }
        c = chunk_z;
        c_end = chunk_z + 1u;
    }
    let kv0 = kvh * p.capacity;
    let npairs = hd / 2u;
    // value pairs lane, lane + 32, lane + 64, lane + 96 (head_dim <= 256)
    let has1 = lane + 32u < npairs;
    let has2 = lane + 64u < npairs;
    let has3 = lane + 96u < npairs;
    // thread li < head_dim: element li of the partial of the chunks so far (attention_part.wgsl)
    var run = Part(NEG, 0.0, 0.0);
    for (; c < c_end; c++) {
        // group g: tile g of chunk c
        let start = c * C + g * L;
        let j = start + lane;
        var s = NEG;
        if (j < n_keys && j >= k0) {
            s = key_dot((kv0 + j) * hd) * p.scale;
        }
        sc[li] = s;
        workgroupBarrier();
        var m = NEG;
        var l = 0.0;
        var o0 = vec2<f32>(0.0);
        var o1 = vec2<f32>(0.0);
        var o2 = vec2<f32>(0.0);
        var o3 = vec2<f32>(0.0);
        if (start < n_keys && start + L > k0) {
            let nk = min(L, n_keys - start);
            let sb = g * L;
            // the tile's max: four chains, then combined (max is exact in any order)
            var t4 = vec4<f32>(NEG);
            var jm = 0u;
            for (; jm + 4u <= nk; jm += 4u) {
                t4 = max(t4, vec4<f32>(sc[sb + jm], sc[sb + jm + 1u], sc[sb + jm + 2u], sc[sb + jm + 3u]));
            }
            m = max(max(t4.x, t4.y), max(t4.z, t4.w));
            for (; jm < nk; jm++) {
                m = max(m, sc[sb + jm]);
            }
            let vb = (kv0 + start) * hd + 2u * lane;
            // Sixteen (then four, then one) keys at a time so that their loads issue together;
            // the additions keep key order.
            var jj = 0u;
            for (; jj + 16u <= nk; jj += 16u) {
                let ea = exp4(sb + jj, m);
                let eb = exp4(sb + jj + 4u, m);
                let ec = exp4(sb + jj + 8u, m);
                let ed = exp4(sb + jj + 12u, m);
                l = sum4(sum4(sum4(sum4(l, ea), eb), ec), ed);
                let r = vb + jj * hd;
                o0 = acc16(o0, r, hd, ea, eb, ec, ed);
                if (has1) {
                    o1 = acc16(o1, r + 64u, hd, ea, eb, ec, ed);
                }
                if (has2) {
                    o2 = acc16(o2, r + 128u, hd, ea, eb, ec, ed);
                }
                if (has3) {
                    o3 = acc16(o3, r + 192u, hd, ea, eb, ec, ed);
                }
            }
            for (; jj + 4u <= nk; jj += 4u) {
                let e = exp4(sb + jj, m);
                l = sum4(l, e);
                let r = vb + jj * hd;
                o0 = acc4(o0, r, hd, e);
                if (has1) {
                    o1 = acc4(o1, r + 64u, hd, e);
                }
                if (has2) {
                    o2 = acc4(o2, r + 128u, hd, e);
                }
                if (has3) {
                    o3 = acc4(o3, r + 192u, hd, e);
                }
            }
            for (; jj < nk; jj++) {
                let e = exp(sc[sb + jj] - m);
                l = l + e;
                let r = vb + jj * hd;
                o0 = fma(vec2<f32>(e), value(r), o0);
                if (has1) {
                    o1 = fma(vec2<f32>(e), value(r + 64u), o1);
                }
                if (has2) {
                    o2 = fma(vec2<f32>(e), value(r + 128u), o2);
                }
                if (has3) {
                    o3 = fma(vec2<f32>(e), value(r + 192u), o3);
                }
            }
        }
        let gb = g * 256u + 2u * lane;
        if (lane < npairs) {
            go[gb] = o0.x;
            go[gb + 1u] = o0.y;
        }
        if (has1) {
            go[gb + 64u] = o1.x;
            go[gb + 65u] = o1.y;
        }
        if (has2) {
            go[gb + 128u] = o2.x;
            go[gb + 129u] = o2.y;
        }
        if (has3) {
            go[gb + 192u] = o3.x;
            go[gb + 193u] = o3.y;
        }
        if (lane == 0u) {
            gm[g] = m;
            gl[g] = l;
        }
        workgroupBarrier();
        // the chunk's partial: the 8 groups' merged in group order with exp(m_g - max_g m_g)
        if (li < hd) {
            var mx = NEG;
            for (var k = 0u; k < G; k++) {
                mx = max(mx, gm[k]);
            }
            var sum = 0.0;
            var acc = 0.0;
            for (var k = 0u; k < G; k++) {
                let f = exp(gm[k] - mx);
                sum = fma(gl[k], f, sum);
                acc = fma(go[k * 256u + li], f, acc);
            }
            if (split) {
                let b = (h * ((p.capacity + C - 1u) / C) + c) * (hd + 2u);
                if (li == 0u) {
                    S[b] = mx;
                    S[b + 1u] = sum;
                }
                S[b + 2u + li] = acc;
            } else {
                run = fold(run, Part(mx, sum, acc));
            }
        }
    }
    if (split) {
        return;
    }
    finish(h, t, li, run);
}
