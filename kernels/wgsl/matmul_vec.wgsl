// matmul_vec.wgsl — the one-token (decode) matmul: Y[r] = sum_c W[r, c] * x[c], with the batch
// matmul's per-row reduction order (matmul.wgsl), so that a token's outputs are bitwise the same
// computed alone or in a batch. Composed at pipeline creation as
//   f32 activations: (packed_<type>.wgsl + mv_w_lazy.wgsl, or bytes.wgsl + dequant_<type>.wgsl +
//     mv_w_eager.wgsl) + mv_x_<source>.wgsl + mv_f32.wgsl
//   Q8 activations (Q4_0, Q4_1, Q8_0): packed_<type>.wgsl + q8dot_<type>.wgsl + mvq_x_<source>.wgsl
//     + matvec_q8.wgsl
//   + this file
//   + mv_main.wgsl (workgroup-memory tree) or mv_main_sg.wgsl (subgroup shuffles, subgroups of 32)
//   + mv_y_store.wgsl (Y[y_off + r] written or added to) or mv_y_silu.wgsl (SiLU·mul epilogue
//     over interleaved gate|up rows, ROWS even)
// with the `LANES` and `ROWS` lines replaced as in matmul.wgsl (LANES * ROWS = 256).
// The x source provides binding 2 (and 4) and `prepare(li)`; mv_x_*.wgsl `xv(c, k)`, vec4 k
// (elements 32c + 4k ..) of chunk c of the f32 input: the activations as they are (plain),
// RMSNorm folded in (norm), or SiLU(gate)·up folded in (silu), each the very bits rmsnorm.wgsl /
// silu_mul.wgsl write; mvq_x_*.wgsl `xq(i)`, word i of the Q8 row. `mv_acc(acc, row, c, nc)`
// (mv_f32.wgsl, matvec_q8.wgsl) folds chunk c of the row into a lane's sum. (mvq_x_merge.wgsl:
// the o projection's Q8 row folded from a split attention's chunk partials, bindings 2, 4, 5.)
//
// Bindings (group 0):
//   0 uniform P { rows, cols, n_tok (1), row_bytes, _, y_off, accumulate, eps (f32 bits: a folded
//       norm, mv_x_norm.wgsl / mvq_x_stage.wgsl) }
//   1 storage read  W: array<WT>   [rows, row_bytes] raw GGUF blocks (bytes.wgsl: u32 words), or
//                                  the repacked ones (packed_<type>.wgsl: vec4<u32>; there
//                                  P.row_bytes is chunks per row)
//   2 storage read  X              see the x source
//   3 storage rw    Y: array<f32>  output r is Y[y_off + r], written or added to (accumulate = 1);
//                                  mv_y_silu.wgsl: see there
//   4 storage read  G              (norm only) see mv_x_norm.wgsl / mvq_x_stage.wgsl
// Dispatch: (ceil(rows / ROWS), 1, 1) workgroups of 256 = ROWS rows x LANES lanes.
//
// Order (matmul.wgsl's): lane l of a row folds chunks l, l+LANES, ... into a sum from zero with
// mv_acc; the lane sums are added by the tree of strides LANES/2, ..., 1.
// Subgroup builtins need no `enable` in this naga (30): the device feature SUBGROUP allows them.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    _pad: u32,
    y_off: u32,
    accumulate: u32,
    eps: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<WT>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;

// The sum of lane `lane`'s chunks of row r (0 past the last row): chunks lane, lane + LANES, ...
// one at a time, in chunk order, from zero. Calls prepare(li) first, which may hold workgroup
// barriers: every invocation calls this. (Loading two chunks ahead measured slower on the H100:
// more live registers.)
fn lane_partial(li: u32, r: u32, lane: u32) -> f32 {
    prepare(li);
    let row = r * p.row_bytes;
    let nc = p.cols / 32u;
    let n = select(0u, nc, r < p.rows);
    var acc = 0.0;
    for (var c = lane; c < n; c += LANES) {
        acc = mv_acc(acc, row, c, nc);
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
