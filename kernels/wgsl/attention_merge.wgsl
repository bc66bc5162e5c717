// attention_merge.wgsl — the second dispatch of a one-token sequence's attention split over chunks
// of keys (after seq_params.wgsl, q8_act.wgsl and attention_part.wgsl): one workgroup of 256
// threads per query head (dispatch (n_head, 1)); thread d < head_dim folds element d of the chunk
// partials the attention dispatch stored in S, in chunk order, and the head's output is written
// as attention.wgsl writes it.
//
// Bindings: 0 SeqP (dynamic offset), 1 S (read, attention_part.wgsl's layout), 4 POS, 5 O, 6 Q8O
// (as attention.wgsl's header); 2 is not read, 3 (VC) only declared for attention_part.wgsl.

@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(3) var<storage, read> VC: array<u32>;
@group(0) @binding(6) var<storage, read_write> Q8O: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let h = wg.x;
    let t = p.t0;
    let kr = key_range(t, li);
    let hd = p.head_dim;
    let n_chunks = (p.capacity + C - 1u) / C;
    var r = Part(NEG, 0.0, 0.0);
    if (li < hd) {
        for (var c = kr.z; c < kr.w; c++) {
            let b = (h * n_chunks + c) * (hd + 2u);
            r = fold(r, Part(S[b], S[b + 1u], S[b + 2u + li]));
        }
    }
    finish(h, t, li, r);
}
