// matmul_vec.wgsl — the decode (n_tok = 1) matmul: Y[r] = sum_c W[r, c] * x[c], with the same
// per-row reduction order as matmul.wgsl, so that a token's outputs are bitwise the same computed
// alone or in a batch. Composed at pipeline creation as
//   (packed_<type>.wgsl + mv_w_lazy.wgsl, or bytes.wgsl + dequant_<type>.wgsl + mv_w_eager.wgsl)
//   + mv_x_<source>.wgsl + this file
//   + mv_main.wgsl (workgroup-memory tree) or mv_main_sg.wgsl (subgroup shuffles, subgroups of 32)
//   + mv_y_store.wgsl (Y[y_off + r] written or added to) or mv_y_silu.wgsl (SiLU·mul epilogue
//     over interleaved gate|up rows, ROWS even)
// with the `LANES` and `ROWS` lines replaced as in matmul.wgsl (LANES * ROWS = 256).
// The x source (mv_x_*.wgsl) provides binding 2 (and 4), `prepare(li)` and `xv(c, k)`, vec4 k
// (elements 32c + 4k ..) of chunk c of the matmul's input: the activations as they are (plain), RMSNorm folded in (norm), or
// SiLU(gate)·up folded in (silu); each computes the very bits rmsnorm.wgsl / silu_mul.wgsl write.
//
// Bindings (group 0):
//   0 uniform P { rows, cols, n_tok (1), row_bytes, y_stride (unused), y_off, accumulate, eps (f32 bits, norm) }
//   1 storage read  W: array<u32>  [rows, row_bytes] raw GGUF blocks (zero-padded to words);
//                   W's element type WT is u32 (bytes.wgsl) or vec4<u32> for the types repacked
//                   at upload (packed_<type>.wgsl: Q4_0, Q4_1, Q8_0; there P.row_bytes is chunks per row)
//   2 storage read  X              see mv_x_*.wgsl
//   3 storage rw    Y: array<f32>  output r is Y[y_off + r], written or added to (accumulate = 1);
//                                  mv_y_silu.wgsl: see there
//   4 storage read  G              (norm only) see mv_x_norm.wgsl
// Dispatch: (ceil(rows / ROWS), 1, 1) workgroups of 256 = ROWS rows x LANES lanes.
//
// Order (matmul.wgsl's): lane l of a row sums chunks l, l+LANES, ... (each chunk a chain of 32
// fused multiply-adds from zero, added to the lane's sum from zero); the lane sums are added by the
// tree of strides LANES/2, ..., 1.
// Subgroup builtins need no `enable` in this naga (30): the device feature SUBGROUP allows them.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    y_stride: u32,
    y_off: u32,
    accumulate: u32,
    eps: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<WT>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 8u;

fn dot4(s: f32, w: vec4<f32>, x: vec4<f32>) -> f32 {
    return fma(w.w, x.w, fma(w.z, x.z, fma(w.y, x.y, fma(w.x, x.x, s))));
}

fn chunk_dot(w: array<vec4<f32>, 8>, c: u32) -> f32 {
    var s = 0.0;
    s = dot4(s, w[0], xv(c, 0u));
    s = dot4(s, w[1], xv(c, 1u));
    s = dot4(s, w[2], xv(c, 2u));
    s = dot4(s, w[3], xv(c, 3u));
    s = dot4(s, w[4], xv(c, 4u));
    s = dot4(s, w[5], xv(c, 5u));
    s = dot4(s, w[6], xv(c, 6u));
    s = dot4(s, w[7], xv(c, 7u));
    return s;
}

// The sum of lane `lane`'s chunks of row r (0 past the last row): chunks lane, lane + LANES, ...
// one at a time, each `chunk_at` (mv_w_lazy.wgsl / mv_w_eager.wgsl) added in chunk order to a
// sum from zero. Calls prepare(li) first, which may hold workgroup barriers: every invocation
// calls this. (Loading two chunks ahead measured slower on the H100: more live registers.)
fn lane_partial(li: u32, r: u32, lane: u32) -> f32 {
    prepare(li);
    let row = r * p.row_bytes;
    let nc = select(0u, p.cols / 32u, r < p.rows);
    var acc = 0.0;
    for (var c = lane; c < nc; c += LANES) {
        acc = acc + chunk_at(row, c);
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
