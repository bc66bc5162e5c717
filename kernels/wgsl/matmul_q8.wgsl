// matmul_q8.wgsl — Y[t, r] = sum_c W[r, c] * X[t, c] for Q4_0 / Q4_1 / Q8_0 weights (repacked,
// packed_<type>.wgsl) against Q8 activations (q8_act.wgsl), by integer dot products
// (q8dot_<type>.wgsl): the prefill (batch) kernel; matvec_q8.wgsl is its one-token twin with the
// same order. Composed as packed.wgsl + packed_<type>.wgsl + q8dot_<type>.wgsl + this file, with
// the `LANES` and `ROWS` lines replaced as in matmul.wgsl (LANES * ROWS = 256).
//
// Bindings (group 0):
//   0 uniform P { rows, cols, n_tok, row_bytes (chunks per row), y_stride, y_off, accumulate, _ }
//   1 storage read  W: array<vec4<u32>>  the repacked weights
//   2 storage read  X: array<vec4<u32>>  [n_tok] Q8 rows of `cols` values (3 * cols / 32 words each)
//   3 storage rw    Y: array<f32>        [n_tok, y_stride]; output (t, r) is Y[t * y_stride + y_off + r],
//                                        written, or added to (accumulate = 1)
// Dispatch: (ceil(rows / ROWS), ceil(n_tok / 8), 1) workgroups of 256 = ROWS rows x LANES lanes.
//
// Batch invariance: lane l of a row folds chunks l, l+LANES, ... into a sum from zero with
// chunk_q8 (exact integer dot, one fused multiply-add per chunk), the lane sums are added by the
// tree of strides LANES/2, ..., 1; tokens only share the loaded weights (8 per workgroup), so a
// token's bits do not depend on the batch.

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
const TT: u32 = 8u;

// [TT][ROWS][LANES] lane partial sums
var<workgroup> part: array<f32, 2048>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % LANES;
    let rl = li / LANES;
    let r = wg.x * ROWS + rl;
    let t0 = wg.y * TT;
    let nt = min(TT, p.n_tok - t0);
    for (var t = 0u; t < nt; t++) {
        part[(t * ROWS + rl) * LANES + lane] = 0.0;
    }
    if (r < p.rows) {
        let row = r * p.row_bytes;
        let nc = p.cols / 32u;
        for (var c = lane; c < nc; c += LANES) {
            let w = load_chunk(row + c);
            for (var t = 0u; t < nt; t++) {
                let xb = (t0 + t) * 3u * nc;
                let i = (t * ROWS + rl) * LANES + lane;
                part[i] = chunk_q8(part[i], w, X[xb + 2u * c], X[xb + 2u * c + 1u], X[xb + 2u * nc + c]);
            }
        }
    }
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
        if (lane < st) {
            for (var t = 0u; t < nt; t++) {
                let i = (t * ROWS + rl) * LANES + lane;
                part[i] = part[i] + part[i + st];
            }
        }
        workgroupBarrier();
    }
    if (r < p.rows) {
        for (var t = lane; t < nt; t += LANES) {
            let y = (t0 + t) * p.y_stride + p.y_off + r;
            let v = part[(t * ROWS + rl) * LANES];
            if (p.accumulate != 0u) {
                Y[y] = Y[y] + v;
            } else {
                Y[y] = v;
            }
        }
    }
}
