// matvec_q8.wgsl — the decode (n_tok = 1) matmul of Q4_0 / Q4_1 / Q8_0 weights against Q8
// activations: Y[r] = sum_c chunk c of row r (integer dot products, q8dot_<type>.wgsl), with
// the batch matmul's (mm_x_q8.wgsl + matmul.wgsl) per-row order, so that a token's outputs are
// bitwise the same computed alone or in a batch. Composed at pipeline creation as
//   packed.wgsl + packed_<type>.wgsl + q8dot_<type>.wgsl + the x source (mvq_x_global.wgsl: Q8
//   rows in memory; or q8_act.wgsl + rms_scale.wgsl + mvq_x_stage.wgsl: f32 input quantized by
//   every workgroup into workgroup memory, RMSNorm optionally folded in) + this file
//   + mv_main.wgsl (workgroup-memory tree) or mv_main_sg.wgsl (subgroup shuffles, subgroups of 32)
//   + mv_y_store.wgsl or mv_y_silu.wgsl (SiLU·mul epilogue over interleaved gate|up rows)
// with the `LANES` and `ROWS` lines replaced as in matmul.wgsl (LANES * ROWS = 256).
//
// Bindings (group 0):
//   0 uniform P { rows, cols, n_tok (1), row_bytes (chunks per row), stage, y_off, accumulate, eps }
//       (stage and eps: mvq_x_stage.wgsl)
//   1 storage read  W: array<vec4<u32>>  the repacked weights (packed_<type>.wgsl)
//   2 storage read  X                    the input, see mvq_x_*.wgsl
//   3 storage rw    Y: array<f32>        output r is Y[y_off + r], written or added to (accumulate = 1);
//                                        mv_y_silu.wgsl: see there
// Dispatch: (ceil(rows / ROWS), 1, 1) workgroups of 256 = ROWS rows x LANES lanes.
//
// Order (mm_x_q8.wgsl + matmul.wgsl's): lane l of a row folds chunks l, l+LANES, ... into a sum from zero
// with chunk_q8 (one fused multiply-add per chunk); the lane sums are added by the tree of strides
// LANES/2, ..., 1.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    stage: u32,
    y_off: u32,
    accumulate: u32,
    eps: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<WT>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;

// The sum of lane `lane`'s chunks of row r (0 past the last row). Calls prepare(li) first, which
// may hold workgroup barriers: every invocation calls this.
fn lane_partial(li: u32, r: u32, lane: u32) -> f32 {
    prepare(li);
    let nc = p.cols / 32u;
    let n = select(0u, nc, r < p.rows);
    let row = r * p.row_bytes;
    var acc = 0.0;
    for (var c = lane; c < n; c += LANES) {
        acc = chunk_q8(acc, load_chunk(row + c), xq(2u * c), xq(2u * c + 1u), xq(2u * nc + c));
    }
    return acc;
}

fn store(r: u32, v: f32) {
    let y = p.y_off + r;
    if (p.accumulate != 0u) {
        Y[y] = Y[y] + v;
    } else {
        Y[y] = v;
    }
}
