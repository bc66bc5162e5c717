// silu_mul.wgsl — OUT = silu(G) * U = (G / (1 + exp(-G))) * U, elementwise.
//
// Bindings (group 0):
//   0 uniform P { n_tok, width, in_stride, up_off, swizzle, pair, _, _ }
//   1 storage read  G: array<f32>    [n_tok, in_stride]; token t's gate values at t * in_stride
//   2 storage read  U: array<f32>    [n_tok, in_stride]; its up values at t * in_stride + up_off (G and
//                                     U may be the same buffer: the layer runner's fused gate|up rows)
//                   pair = 1 (gate|up rows interleaved at upload, upload.rs): gate value e at
//                   t * in_stride + 2e, up at that + up_off (= 1)
//   3 storage rw    OUT: array<f32>  [n_tok, width]; swizzle = 1 (the layer runner, width a multiple
//                                     of 32): each row in the f32 matmul input's (mm_x_f32.wgsl) chunk-major layout (element
//                                     32c + 4k + i at 4 * (k * width / 32 + c) + i)
// Dispatch: one thread per output element, 256 per workgroup, workgroups (x, y) with linear index
// y * num_workgroups.x + x.

struct P {
    n_tok: u32,
    width: u32,
    in_stride: u32,
    up_off: u32,
    swizzle: u32,
    pair: u32,
    _b: u32,
    _c: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read> U: array<f32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    if (i < p.n_tok * p.width) {
        let t = i / p.width;
        let j = t * p.in_stride + (i % p.width) * select(1u, 2u, p.pair != 0u);
        let g = G[j];
        var o = i;
        if (p.swizzle != 0u) {
            let e = i % p.width;
            o = t * p.width + (((e >> 2u) & 7u) * (p.width >> 5u) + (e >> 5u)) * 4u + (e & 3u);
        }
        OUT[o] = g / (1.0 + exp(-g)) * U[j + p.up_off];
    }
}
