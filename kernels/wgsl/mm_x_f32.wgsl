// mm_x_f32.wgsl — input of matmul.wgsl for f32 activations (after the weight decoder: bytes.wgsl +
// dequant_<type>.wgsl, or packed.wgsl + packed_<type>.wgsl): the `matmul` pipelines.
//   2 storage read  X: array<vec4<f32>>  [n_tok, cols] f32 activations (cols a multiple of 32), each
//                                        token's row in the chunk-major ("swizzled") layout: element
//                                        32c + 4k + i of the row is at vec4 k * (cols / 32) + c, lane i,
//                                        so that the lanes of a row, which read chunks l, l+LANES, ...,
//                                        read consecutive 16-byte words (the producers, rmsnorm.wgsl,
//                                        attention.wgsl and silu_mul.wgsl, write it with `swizzle` = 1)
// A chunk is dequantized once (mm_chunk) and dotted with each token's 32 values by a chain of 32
// fused multiply-adds from zero, added to the lane's sum (mm_acc).

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

alias MmChunk = array<vec4<f32>, 8>;

fn dot4(s: f32, w: vec4<f32>, x: vec4<f32>) -> f32 {
    return fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, fma(w.x, x.x, s))));
}

fn mm_chunk(row: u32, c: u32) -> MmChunk {
    return dequant_chunk(row, c);
}

// acc + chunk c of token t's row times w
fn mm_acc(acc: f32, w: MmChunk, t: u32, c: u32, nc: u32) -> f32 {
    let xb = t * (p.cols / 4u) + c;
    var s = 0.0;
    s = dot4(s, w[0], X[xb]);
    s = dot4(s, w[1], X[xb + nc]);
    s = dot4(s, w[2], X[xb + 2u * nc]);
    s = dot4(s, w[3], X[xb + 3u * nc]);
    s = dot4(s, w[4], X[xb + 4u * nc]);
    s = dot4(s, w[5], X[xb + 5u * nc]);
    s = dot4(s, w[6], X[xb + 6u * nc]);
    s = dot4(s, w[7], X[xb + 7u * nc]);
    return acc + s;
}
