// gated.wgsl — the gated FFN activation of one element, shared by silu_mul.wgsl (f32 output) and
// silu_mul_q8.wgsl (Q8 rows): one expression, so one set of bits. Prepended to either.
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
// (swizzle: silu_mul.wgsl's output layout; binding 3 is the including file's.)

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

// act(gate) * up of element e (< width) of token t.
fn gated(t: u32, e: u32) -> f32 {
    let j = t * p.in_stride + e * select(1u, 2u, p.pair != 0u);
    let g = G[j];
    var a = g / (1.0 + exp(-g));
    if (p.gelu != 0u) {
        let u = 0.7978846 * g * (1.0 + 0.044715 * g * g);
        a = g / (1.0 + exp(min(-2.0 * u, 80.0))); // no overflow: below, act(g) < 1e-33 |g|
    }
    return a * U[j + p.up_off];
}
