// silu_mul_q8.wgsl — the gated FFN activation written as Q8 rows (the down projection's input when
// it multiplies by integer dots): silu_mul.wgsl's values (gated.wgsl, the same expression)
// quantized by q8_coop, as quantize_q8.wgsl would quantize silu_mul.wgsl's output, without the
// f32 rows in between. Composed as q8_act.wgsl + gated.wgsl + this file. width a multiple of 32.
//
// Bindings (group 0): 0-2 see gated.wgsl (swizzle ignored);
//   3 storage rw    Y: array<vec4<u32>>  [n_tok] Q8 rows (3 * width / 32 words each, q8_act.wgsl)
// Dispatch: one thread per (token, vec4 of 4 values), 256 per workgroup (32 blocks), workgroups
// (x, y) with linear index y * num_workgroups.x + x (quantize_q8.wgsl's).

@group(0) @binding(3) var<storage, read_write> Y: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let nc = p.width / 32u;
    let g = (wg.y * nw.x + wg.x) * 256u + li;
    let live = g < p.n_tok * nc * 8u;
    // token t, block b, vec4 k of the block: elements 32 b + 4 k .. + 3
    let t = g / (nc * 8u);
    let b = (g / 8u) % nc;
    let k = g % 8u;
    var v = vec4<f32>(0.0);
    if (live) {
        let e = 32u * b + 4u * k;
        v = vec4<f32>(gated(t, e), gated(t, e + 1u), gated(t, e + 2u), gated(t, e + 3u));
    }
    let q = q8_coop(li, v);
    if (live) {
        let base = t * 3u * nc;
        Y[base + 2u * b + k / 4u][k % 4u] = q.word;
        if (k == 0u) {
            Y[base + 2u * nc + b] = q.sums;
        }
    }
}
