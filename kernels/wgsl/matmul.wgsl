// matmul.wgsl — Y[t, r] = sum_c W[r, c] * X[t, c], the batch (prefill) matmul, also used for one
// token where the decode kernels are off: one pipeline, one reduction order. Composed at pipeline
// creation as the weight decoder (bytes.wgsl + dequant_<type>.wgsl, or packed.wgsl +
// packed_<type>.wgsl for the types repacked at upload) + the input (mm_x_f32.wgsl: f32
// activations, or q8dot_<type>.wgsl + mm_x_q8.wgsl: Q8 activations and integer dot products) +
// this file, with the `LANES` and `ROWS` lines replaced by the context's choice (LANES * ROWS =
// 256): 32 lanes per row on GPUs, 1 on software rasterizers, where workgroup-memory reductions are
// slow.
//
// Bindings (group 0):
//   0 uniform P { rows, cols, n_tok, row_bytes, y_stride, y_off, accumulate, _ }
//   1 storage read  W: array<u32>        [rows, row_bytes] raw GGUF blocks (zero-padded to words);
//                   W's element type WT is u32 (bytes.wgsl) or vec4<u32> for the types repacked
//                   at upload (packed_<type>.wgsl: Q4_0, Q4_1, Q8_0; there P.row_bytes is chunks per row)
//   2 storage read  X                    the activations, see mm_x_*.wgsl
//   3 storage rw    Y: array<f32>        [n_tok, y_stride]; output (t, r) is Y[t * y_stride + y_off + r],
//                                        written, or added to (accumulate = 1: a fused residual add,
//                                        the same single f32 addition as add.wgsl)
// Dispatch: (ceil(rows / ROWS), ceil(n_tok / 8), 1) workgroups of 256 = ROWS rows x LANES lanes.
//
// Batch invariance: a (row, token) dot is split into 32-element chunks; lane l of the row's LANES
// lanes folds chunks l, l+LANES, l+2*LANES, ... into its sum from zero in that order (mm_acc), and
// the lane sums are added by a fixed tree (strides LANES/2, ..., 2, 1). Tokens only share the
// decoded weights (8 tokens per workgroup); nothing about a token's arithmetic depends on how many
// tokens are in the batch or where it sits.

// P, W and Y: mm_io.wgsl (prepended).

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
            let w = mm_chunk(row, c);
            for (var t = 0u; t < nt; t++) {
                let i = (t * ROWS + rl) * LANES + lane;
                part[i] = mm_acc(part[i], w, t0 + t, c, nc);
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
