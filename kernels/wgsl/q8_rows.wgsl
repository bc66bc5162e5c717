// q8_rows.wgsl — entry point of the kernels that write whole Q8 rows (q8_act.wgsl's layout), one
// thread per (token, vec4 of 4 values), 256 per workgroup (32 blocks), workgroups (x, y) with
// linear index y * num_workgroups.x + x. Appended after the input part, which defines:
//   Y                     the Q8 rows, array<vec4<u32>> (3 * cols / 32 words a token)
//   q8_shape() -> vec2    (cols, n_tok), cols a multiple of 32
//   q8_in(t, b, k) -> vec4<f32>  elements 32 b + 4 k .. + 3 of token t
// quantize_q8.wgsl (f32 rows), silu_mul_q8.wgsl (SiLU·mul of gate|up rows).

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let shape = q8_shape();
    let nc = shape.x / 32u;
    let g = (wg.y * nw.x + wg.x) * 256u + li;
    let live = g < shape.y * nc * 8u;
    // token t, block b, vec4 k of the block
    let t = g / (nc * 8u);
    let b = (g / 8u) % nc;
    let k = g % 8u;
    var v = vec4<f32>(0.0);
    if (live) {
        v = q8_in(t, b, k);
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
