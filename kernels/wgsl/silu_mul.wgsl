// silu_mul.wgsl — the gated FFN activation, elementwise, as f32: OUT = act(G) * U (gated.wgsl,
// prepended: P, bindings 0-2, the expression).
//
// Bindings (group 0): 0-2 see gated.wgsl;
//   3 storage rw    OUT: array<f32>  [n_tok, width]; swizzle = 1 (the layer runner, width a multiple
//                                     of 32): each row in the f32 matmul input's (mm_x_f32.wgsl) chunk-major layout (element
//                                     32c + 4k + i at 4 * (k * width / 32 + c) + i)
// Dispatch: one thread per output element, 256 per workgroup, workgroups (x, y) with linear index
// y * num_workgroups.x + x.

@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    if (i < p.n_tok * p.width) {
        let t = i / p.width;
        let e = i % p.width;
        var o = i;
        if (p.swizzle != 0u) {
            o = t * p.width + (((e >> 2u) & 7u) * (p.width >> 5u) + (e >> 5u)) * 4u + (e & 3u);
        }
        OUT[o] = gated(t, e);
    }
}
