// matmul_tile.wgsl — the batch (prefill) matmul of the repacked types (Q4_0, Q4_1, Q8_0) against
// Q8 activations, tiled: Y[t, r] = sum_c W[r, c] * X[t, c] for a tile of ROWS * TR rows x TT
// tokens per workgroup, the partial sums held in registers. Composed as packed.wgsl +
// packed_<type>.wgsl + q8dot_<type>.wgsl + this file + mt_main.wgsl (workgroup-memory tree) or
// mt_main_sg.wgsl (subgroup shuffles, subgroups of exactly LANES), with the `LANES`, `ROWS` and
// `TR` lines replaced by the context's choice (LANES * ROWS = 256). Bindings, parameters and
// outputs are matmul.wgsl's (mm_x_q8.wgsl's X); the `matmul_q8` pipelines when
// WgpuOptions::tile is on.
//
// Dispatch: (ceil(rows / (ROWS * TR)), ceil(n_tok / TT), 1) workgroups of 256 threads: ROWS
// groups of LANES lanes; group g holds rows (wg.x * ROWS + g) * TR .. + TR - 1 of tokens
// wg.y * TT .. + TT - 1.
//
// Batch invariance: the order of matmul.wgsl and matvec_q8.wgsl, for every (row, token): lane l
// folds chunks l, l + LANES, ... into a sum from zero by chunk_q8 (an exact integer dot, then the
// type's fused multiply-adds), and the lane sums are added by the tree of strides LANES / 2, ..., 1.
// A thread loads a chunk of each of its TR rows once and folds it into the sums of TT tokens; the
// tokens' Q8 blocks come from memory (shared by the ROWS groups through the cache). Nothing about
// a token's arithmetic depends on the batch or on the tile it falls in.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    y_stride: u32,
    y_off: u32,
    accumulate: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<WT>;
@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

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

// The tile of group `grp` (lane `lane`): lane sums in registers (acc[r * TT + t]: row r0 + r,
// token t0 + t), then `finish` (mt_main*.wgsl) adds the lanes and stores the nt live tokens.
// Every invocation calls it.
fn tile(li: u32, lane: u32, grp: u32, wg: vec3<u32>) {
    let r0 = (wg.x * ROWS + grp) * TR;
    let t0 = wg.y * TT;
    let nt = min(TT, p.n_tok - t0);
    let nc = p.cols / 32u;
    var acc: array<f32, TR * TT>;
    for (var i = 0u; i < TR * TT; i++) {
        acc[i] = 0.0;
    }
    for (var c = lane; c < nc; c += LANES) {
        var w: array<Raw, TR>;
        for (var r = 0u; r < TR; r++) {
            // rows past the last compute a copy of it, never stored
            w[r] = load_chunk(min(r0 + r, p.rows - 1u) * p.row_bytes + c);
        }
        for (var t = 0u; t < TT; t++) {
            if (t < nt) {
                let xb = (t0 + t) * 3u * nc;
                let x0 = X[xb + 2u * c];
                let x1 = X[xb + 2u * c + 1u];
                let xm = X[xb + 2u * nc + c];
                for (var r = 0u; r < TR; r++) {
                    acc[r * TT + t] = chunk_q8(acc[r * TT + t], w[r], x0, x1, xm);
                }
            }
        }
    }
    finish(li, lane, r0, t0, nt, acc);
}
