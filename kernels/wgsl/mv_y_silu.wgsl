// mv_y_silu.wgsl — `finish` of matmul_vec.wgsl with SiLU·mul as the epilogue, for gate|up rows
// interleaved at upload (upload.rs: row 2e is gate row e, row 2e + 1 up row e; P.rows = 2 * n_ff).
// Both rows of output e sit in one workgroup (ROWS even, a workgroup's first row even): their
// sums meet in workgroup memory and lane 0 of the gate row writes
//   Y[y_off + swz(e)] = g / (1 + exp(-g)) * u
// silu_mul.wgsl's expression on the very bits the plain store would have written (same reduction),
// so the same bits; swz(e) is silu_mul.wgsl's swizzled layout for a row of width n_ff (element
// 32c + 4k + i at 4 * (k * n_ff / 32 + c) + i), the layout the down projection reads.
// Y (binding 3) is then the [n_ff] SiLU·mul output; P.accumulate is ignored. No bindings of its own.
// Called by every invocation (it holds a workgroup barrier).

var<workgroup> pair_sum: array<f32, ROWS>;

fn finish(r: u32, j: u32, lane: u32, v: f32) {
    if (lane == 0u) {
        pair_sum[j] = v;
    }
    workgroupBarrier();
    if (lane == 0u && (j & 1u) == 0u && r + 1u < p.rows) {
        let g = pair_sum[j];
        let u = pair_sum[j + 1u];
        let e = r >> 1u;
        let w = p.rows >> 1u;
        Y[p.y_off + (((e >> 2u) & 7u) * (w >> 5u) + (e >> 5u)) * 4u + (e & 3u)] = g / (1.0 + exp(-g)) * u;
    }
}
