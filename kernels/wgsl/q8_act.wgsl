// q8_act.wgsl — activations quantized to 8 bits ("Q8 rows"), the CPU engine's BlockQ8
// (src/backend/cpu/quant.rs, GGML's q8_0 / q8_1 arithmetic), for the matmuls of Q4_0, Q4_1 and
// Q8_0 weights (matvec_q8.wgsl, mm_x_q8.wgsl: integer dot products). No bindings of its own.
//
// Layout of a row of `cols` values, nc = cols / 32 blocks, in 16-byte words (array<vec4<u32>>):
//   words 2b, 2b + 1   block b's 32 values as int8: element 16h + 4k + i at byte i of
//                      component k of word 2b + h
//   word 2nc + b       (d, s, isum, 0): d the scale (f32 bits, rounded to f16), isum the sum of
//                      the 32 int8 values (i32 bits), s = d_unrounded * isum rounded to f16 (f32 bits)
// Token t's row starts at word t * 3 * nc.
//
// Quantization (q8_coop): amax = max |v|, d = amax / 127, q = round(v * 127 / amax) (ties to
// even, WGSL's round), as quantize_block_q8; the result depends only on the block's 32 values.

// f16_round(v) = f32(f16(v)), round to nearest even, done on the bits: a pack2x16float /
// unpack2x16float round trip is folded away by some drivers (NVIDIA 580: the value came back
// unrounded). Below 2^-14 (f16 subnormals) the steps are 2^-24. Finite f16 range assumed.
fn f16_round(v: f32) -> f32 {
    if (abs(v) < 6.103515625e-05) {
        return round(v * 16777216.0) * 5.9604644775390625e-08;
    }
    let b = bitcast<u32>(v);
    return bitcast<f32>((b + 0x0FFFu + ((b >> 13u) & 1u)) & 0xFFFFE000u);
}

var<workgroup> q8_amax: array<f32, 256>;
var<workgroup> q8_isum: array<i32, 256>;

// What q8_coop hands one thread: its packed word (4 int8) and, valid in the block's first
// thread, the block's (d, s, isum, 0) word.
struct Q8Part {
    word: u32,
    sums: vec4<u32>,
}

// Cooperative quantization by a workgroup of 256: thread li holds vec4 (li % 8) of a block, i.e.
// elements 4 (li % 8) .. + 3 (8 consecutive threads per block, 32 blocks per round; threads past
// the data pass zeros). The word goes to component (li % 8) % 4 of the block's word 2b + (li % 8) / 4.
// Every invocation calls it (two barriers); it may be called in a workgroup-uniform loop.
fn q8_coop(li: u32, v: vec4<f32>) -> Q8Part {
    let a = abs(v);
    q8_amax[li] = max(max(a.x, a.y), max(a.z, a.w));
    workgroupBarrier();
    let b0 = li & ~7u;
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
        amax = max(amax, q8_amax[b0 + j]);
    }
    let d = amax / 127.0;
    var id = 0.0;
    if (amax != 0.0) {
        id = 127.0 / amax;
    }
    let q = vec4<i32>(round(v * id));
    q8_isum[li] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    var sum = 0i;
    for (var j = 0u; j < 8u; j++) {
        sum += q8_isum[b0 + j];
    }
    let u = bitcast<vec4<u32>>(q) & vec4<u32>(0xFFu);
    let word = u.x | (u.y << 8u) | (u.z << 16u) | (u.w << 24u);
    let sums = vec4<u32>(bitcast<u32>(f16_round(d)), bitcast<u32>(f16_round(d * f32(sum))), bitcast<u32>(sum), 0u);
    return Q8Part(word, sums);
}
