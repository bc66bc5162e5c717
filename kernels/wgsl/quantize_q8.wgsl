// quantize_q8.wgsl — f32 activation rows to Q8 rows (q8_act.wgsl, prepended: q8_coop), the input
// of the integer-dot matmuls (mm_x_q8.wgsl, matvec_q8.wgsl).
//
// Bindings (group 0):
//   0 uniform P { cols, n_tok, swizzle, _ }
//   1 storage read  X: array<vec4<f32>>  [n_tok, cols / 4]; swizzle = 1: each row in matmul.wgsl's
//                                        chunk-major layout (vec4 k of block c at k * cols / 32 + c)
//   2 storage rw    Y: array<vec4<u32>>  [n_tok] Q8 rows (3 * cols / 32 words each)
// Dispatch: one thread per (token, vec4 of 4 values), 256 per workgroup (32 blocks), workgroups
// (x, y) with linear index y * num_workgroups.x + x.

struct P {
    cols: u32,
    n_tok: u32,
    swizzle: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> Y: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let nc = p.cols / 32u;
    let g = (wg.y * nw.x + wg.x) * 256u + li;
    let live = g < p.n_tok * nc * 8u;
    // token t, block b, vec4 k of the block
    let t = g / (nc * 8u);
    let b = (g / 8u) % nc;
    let k = g % 8u;
    var v = vec4<f32>(0.0);
    if (live) {
        v = X[t * nc * 8u + select(8u * b + k, k * nc + b, p.swizzle != 0u)];
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
