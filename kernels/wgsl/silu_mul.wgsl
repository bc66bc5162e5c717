// silu_mul.wgsl — the gated FFN activation, elementwise: OUT = act(G) * U with
//   gelu = 0: SiLU (SwiGLU), act(g) = g / (1 + exp(-g))
//   gelu = 1: tanh-form GELU (GeGLU, Gemma), act(g) = 0.5 g (1 + tanh(u)), u = √(2/π) (g + 0.044715 g³),
//             computed as g / (1 + exp(-2u)) (the same function; WGSL's exp is specified to a few
//             ulp, its tanh only through sinh / cosh). u as the CPU reference forms it
//             (ops::gelu_tanh): √(2/π) · g · (1 + 0.044715 · g · g).
//
// Bindings (group 0):
//   0 uniform P { n_tok, width, in_stride, up_off, swizzle, pair, gelu, _ }
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
    gelu: u32,
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
        var a = g / (1.0 + exp(-g));
        if (p.gelu != 0u) {
            let u = 0.7978846 * g * (1.0 + 0.044715 * g * g);
            a = g / (1.0 + exp(min(-2.0 * u, 80.0))); // no overflow: below, act(g) < 1e-33 |g|
        }
        OUT[o] = a * U[j + p.up_off];
    }
}
