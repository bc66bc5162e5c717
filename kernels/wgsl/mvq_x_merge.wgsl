// mvq_x_merge.wgsl — x source of matvec_q8.wgsl for the o projection of a step of one token
// whose attention was split over chunks of keys (attention.wgsl's split dispatch stored the
// chunk partials in S): every workgroup folds the partials itself while it builds its Q8 input
// in workgroup memory (`prepare`), so that no attention_merge dispatch runs. The Q8 row is the
// very one attention_merge.wgsl writes: element d of head h is the fold (attention_fold.wgsl
// `fold4`: `fold` on 4 elements, in chunk order from (NEG, 0, 0)) of the head's partials of the
// query's chunks, then o / l (0 where l is 0), as attention_part.wgsl's `finish`; then q8_coop,
// whose blocks of 32 are the same 8 vec4s in the same order (head_dim a multiple of 32, so a
// block lies inside one head).
// Prepended: q8_act.wgsl, mvq_x_put.wgsl (XS, put_q8, xq), seq_params.wgsl, attention_fold.wgsl.
//   2 storage read  S: array<f32>    the sequence's chunk partials (attention_part.wgsl's layout)
//   4 storage read  POS: array<u32>  [t0 + 1] the token's position at POS[t0]
//   5 uniform SeqP (seq_params.wgsl; dynamic offset: the sequence's slot; n_tok = 1)
// P.cols = n_head * head_dim, P.cols / 32 * 3 <= XS_WORDS.

@group(0) @binding(2) var<storage, read> S: array<f32>;
@group(0) @binding(4) var<storage, read> POS: array<u32>;
@group(0) @binding(5) var<uniform> sp: SeqP;

// Elements d .. d + 3 of head h: the head's partials of chunks c0 .. c1 folded (fold4), divided
// by the sum.
fn merged(h: u32, d: u32, c0: u32, c1: u32, n_chunks: u32) -> vec4<f32> {
    let hd = sp.head_dim;
    var r = Part4(NEG, 0.0, vec4<f32>(0.0));
    for (var c = c0; c < c1; c++) {
        let b = (h * n_chunks + c) * (hd + 2u) + 2u + d;
        r = fold4(r, Part4(S[b - 2u - d], S[b - 1u - d], vec4<f32>(S[b], S[b + 1u], S[b + 2u], S[b + 3u])));
    }
    var v = vec4<f32>(0.0);
    if (r.l > 0.0) {
        v = r.o / r.l;
    }
    return v;
}

fn prepare(li: u32) {
    let nv = p.cols / 32u * 8u;
    let hd = sp.head_dim;
    // the query's keys and chunks (attention_part.wgsl `key_range`)
    let n_keys = POS[sp.t0] + 1u;
    var k0 = 0u;
    if (sp.window != 0u && n_keys > sp.window) {
        k0 = n_keys - sp.window;
    }
    let c0 = k0 / C;
    let c1 = (n_keys + C - 1u) / C;
    let n_chunks = (sp.capacity + C - 1u) / C;
    for (var j0 = 0u; j0 < nv; j0 += 256u) {
        let j = j0 + li;
        var v = vec4<f32>(0.0);
        if (j < nv) {
            let h = 4u * j / hd;
            let d = 4u * j % hd;
            v = merged(h, d, c0, c1, n_chunks);
        }
        put_q8(li, j, nv, v);
    }
    workgroupBarrier();
}
