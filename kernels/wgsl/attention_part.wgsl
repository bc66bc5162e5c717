// attention_part.wgsl — what attention.wgsl and attention_merge.wgsl share (after seq_params.wgsl,
// q8_act.wgsl and attention_fold.wgsl; each file's prefix declares Q8O and the partials' buffer
// S): the bindings of the sequence's parameters, positions and output, the key range of a query
// and the writing of a head's output row (the chunk size and `fold`: attention_fold.wgsl, which
// mvq_x_merge.wgsl shares too).
//
// Keys are cut into chunks of C = 256 at absolute positions 0, 256, 512, ...; a chunk's partial is
// (m, l, o): the max of its scores, the sum of exp(s - m) and the exp-weighted sum of its values.
// The partials of a query head are folded in chunk order from (NEG, 0, 0) by `fold`, whether one
// workgroup walks every chunk (attention.wgsl) or one workgroup per chunk stores its partial in S
// and attention_merge.wgsl folds them: the same operations on the same values, so the same bits.
//
// S (f32): per (query head h, chunk c) of the one-token sequence, at ((h * n_chunks + c) * (head_dim
// + 2)): m, l, then o[0 .. head_dim]; n_chunks = ceil(capacity / C).

@group(0) @binding(0) var<uniform> p: SeqP;
@group(0) @binding(4) var<storage, read> POS: array<u32>;
@group(0) @binding(5) var<storage, read_write> O: array<f32>;

// [256] a head's output (for the Q8 rows); attention.wgsl also holds scores in it
var<workgroup> sc: array<f32, 256>;
// key count, shared so that loop bounds are workgroup-uniform
var<workgroup> nkeys: u32;

// Number of keys of query t (the workgroup's), the first key of its window, and its first chunk
// and chunk count: every thread gets the same (workgroup-uniform) values.
fn key_range(t: u32, li: u32) -> vec4<u32> {
    if (li == 0u) {
        nkeys = POS[t] + 1u;
    }
    workgroupBarrier();
    let n_keys = workgroupUniformLoad(&nkeys);
    // first key inside the sliding window (0 without one)
    var k0 = 0u;
    if (p.window != 0u && n_keys > p.window) {
        k0 = n_keys - p.window;
    }
    return vec4<u32>(n_keys, k0, k0 / C, (n_keys + C - 1u) / C);
}

// Values (e, e + 1) of VC (declared by each file's prefix), e even.
fn v_pair(e: u32) -> vec2<f32> {
    if (p.kv_f16 != 0u) {
        return unpack2x16float(VC[e >> 1u]);
    }
    return vec2<f32>(bitcast<f32>(VC[e]), bitcast<f32>(VC[e + 1u]));
}

// Index in O of element d of query head h's output of token row t (swizzled for the o projection
// when p.swizzle).
fn o_index(t: u32, h: u32, d: u32) -> u32 {
    let hd = p.head_dim;
    if (p.swizzle != 0u) {
        let width = p.n_head * hd;
        let e = h * hd + d;
        return t * width + (((e >> 2u) & 7u) * (width >> 5u) + (e >> 5u)) * 4u + (e & 3u);
    }
    return (t * p.n_head + h) * hd + d;
}

// Stores q8_coop's result of the thread holding elements d .. d + 3 (d a multiple of 4) of query
// head h's output of token row t into the Q8 rows.
fn q8_put(t: u32, h: u32, d: u32, q: Q8Part) {
    let nc = p.n_head * p.head_dim / 32u;
    let b = (h * p.head_dim + d) / 32u;
    let k = (d % 32u) / 4u;
    let base = t * 3u * nc;
    Q8O[base + 2u * b + k / 4u][k % 4u] = q.word;
    if (k == 0u) {
        Q8O[base + 2u * nc + b] = q.sums;
    }
}

// The head's output: thread d < head_dim holds element d of the folded partial `r`; writes
// O and, when p.q8_out, the Q8 row. Every thread of the workgroup calls it (workgroup barrier
// inside).
fn finish(h: u32, t: u32, li: u32, r: Part) {
    let hd = p.head_dim;
    if (li < hd) {
        var v = 0.0;
        if (r.l > 0.0) {
            v = r.o / r.l;
        }
        O[o_index(t, h, li)] = v;
        sc[li] = v;
    }
    if (p.q8_out != 0u) {
        // the head's values as 4 values per thread, 8 threads per block of 32 (q8_coop)
        workgroupBarrier();
        let nv = hd / 4u;
        let live = li < nv;
        var v = vec4<f32>(0.0);
        if (live) {
            v = vec4<f32>(sc[4u * li], sc[4u * li + 1u], sc[4u * li + 2u], sc[4u * li + 3u]);
        }
        let q = q8_coop(li, v);
        if (live) {
            q8_put(t, h, 4u * li, q);
        }
    }
}
