// matmul_tile.wgsl — the batch (prefill) matmul of the repacked types (Q4_0, Q4_1, Q8_0) against
// Q8 activations, tiled: Y[t, r] = sum_c W[r, c] * X[t, c] for a tile of ROWS * TR rows x TT
// tokens per workgroup (TR = 4, TT = 8), the partial sums held in registers. Composed as
// packed.wgsl + packed_<type>.wgsl + q8dot_<type>.wgsl + this file + mt_main.wgsl
// (workgroup-memory tree) or mt_main_sg.wgsl (subgroup shuffles, subgroups of exactly LANES = 32),
// with the `LANES` and `ROWS` lines replaced by the context's choice (LANES * ROWS = 256).
// Bindings, parameters and outputs are matmul.wgsl's (mm_x_q8.wgsl's X); the layer runner's
// `matmul_tile` pipelines (WgpuOptions::tile).
//
// Dispatch: (ceil(rows / (ROWS * TR)), ceil(n_tok / TT), 1) workgroups of 256 threads: ROWS
// groups of LANES lanes; group g holds rows (wg.x * ROWS + g) * TR .. + TR - 1 of tokens
// wg.y * TT .. + TT - 1.
//
// Batch invariance: the order of matmul.wgsl and matvec_q8.wgsl, for every (row, token): lane l
// folds chunks l, l + LANES, ... into a sum from zero by chunk_q8 (an exact integer dot, then the
// type's fused multiply-adds), and the lane sums are added by the tree of strides LANES / 2, ..., 1.
// A thread loads a chunk of each of its TR rows once and folds it into the sums of TT tokens; the
// tokens' Q8 blocks come from memory (shared by the ROWS groups through the cache). TR and TT
// are fixed: the code below is written out for them. Nothing about
// a token's arithmetic depends on the batch or on the tile it falls in.

// P, W and Y: mm_io.wgsl (prepended).
@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;
const TR: u32 = 4u;
const TT: u32 = 8u;

// output (r, token t) = v: written, or added to (accumulate = 1)
fn put(r: u32, t: u32, v: f32) {
    let y = t * p.y_stride + p.y_off + r;
    if (p.accumulate != 0u) {
        Y[y] = Y[y] + v;
    } else {
        Y[y] = v;
    }
}

// acc + token t's chunk c times the chunks of four rows (component j: row r0 + j); tokens past
// the last add nothing (never stored).
fn tok(acc: vec4<f32>, w0: Raw, w1: Raw, w2: Raw, w3: Raw, t: u32, c: u32, nc: u32) -> vec4<f32> {
    if (t >= p.n_tok) {
        return acc;
    }
    let xb = t * 3u * nc;
    let x0 = X[xb + 2u * c];
    let x1 = X[xb + 2u * c + 1u];
    let xm = X[xb + 2u * nc + c];
    return vec4<f32>(chunk_q8(acc.x, w0, x0, x1, xm), chunk_q8(acc.y, w1, x0, x1, xm), chunk_q8(acc.z, w2, x0, x1, xm), chunk_q8(acc.w, w3, x0, x1, xm));
}

// The tile of group `grp` (lane `lane`): lane sums in registers (a<t>.<j>: row r0 + j, token
// t0 + t; written out, not arrays, so that they stay in registers), then `finish` (mt_main*.wgsl)
// adds the lanes and stores the live tokens. Every invocation calls it.
fn tile(li: u32, lane: u32, grp: u32, wg: vec3<u32>) {
    let r0 = (wg.x * ROWS + grp) * TR;
    let t0 = wg.y * TT;
    let nc = p.cols / 32u;
    // rows past the last compute a copy of it, never stored
    let last = p.rows - 1u;
    let o0 = min(r0, last) * p.row_bytes;
    let o1 = min(r0 + 1u, last) * p.row_bytes;
    let o2 = min(r0 + 2u, last) * p.row_bytes;
    let o3 = min(r0 + 3u, last) * p.row_bytes;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    for (var c = lane; c < nc; c += LANES) {
        let w0 = load_chunk(o0 + c);
        let w1 = load_chunk(o1 + c);
        let w2 = load_chunk(o2 + c);
        let w3 = load_chunk(o3 + c);
        a0 = tok(a0, w0, w1, w2, w3, t0, c, nc);
        a1 = tok(a1, w0, w1, w2, w3, t0 + 1u, c, nc);
        a2 = tok(a2, w0, w1, w2, w3, t0 + 2u, c, nc);
        a3 = tok(a3, w0, w1, w2, w3, t0 + 3u, c, nc);
        a4 = tok(a4, w0, w1, w2, w3, t0 + 4u, c, nc);
        a5 = tok(a5, w0, w1, w2, w3, t0 + 5u, c, nc);
        a6 = tok(a6, w0, w1, w2, w3, t0 + 6u, c, nc);
        a7 = tok(a7, w0, w1, w2, w3, t0 + 7u, c, nc);
    }
    finish(li, lane, r0, t0, a0, a1, a2, a3, a4, a5, a6, a7);
}
