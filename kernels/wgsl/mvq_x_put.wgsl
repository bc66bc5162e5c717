// mvq_x_put.wgsl — the Q8 input row that an x source of matvec_q8.wgsl builds in workgroup memory
// (mvq_x_stage.wgsl, mvq_x_merge.wgsl): XS holds the row's packed words (2 vec4s a block of 32),
// then the blocks' sums, as a Q8 row in memory is laid out (q8_act.wgsl); `xq` reads it back.
// Prepended: q8_act.wgsl. P.cols / 32 * 3 <= XS_WORDS.

const XS_WORDS: u32 = 576u;
var<workgroup> XS: array<vec4<u32>, 576>;

// Quantizes vec4 j of a row of nv vec4s with the whole workgroup (q8_coop: every invocation
// calls it, also those past the row, whose v is ignored) and stores its word and, for a block's
// first vec4, the block's sums.
fn put_q8(li: u32, j: u32, nv: u32, v: vec4<f32>) {
    let q = q8_coop(li, v);
    if (j < nv) {
        let b = j / 8u;
        let k = j % 8u;
        XS[2u * b + k / 4u][k % 4u] = q.word;
        if (k == 0u) {
            XS[2u * (nv / 8u) + b] = q.sums;
        }
    }
}

fn xq(i: u32) -> vec4<u32> {
    return XS[i];
}
