// mv_y_silu_q8.wgsl — `finish` of matvec_q8.wgsl for interleaved gate|up rows (upload.rs: row 2e
// gate row e, row 2e + 1 up row e) in workgroups of ROWS rows, ROWS / 2 a multiple of 32 (LANES
// <= 4): mv_y_silu.wgsl's SiLU·mul of the workgroup's ROWS / 2 outputs, written to Y (f32,
// swizzled, as there), and the same values quantized by q8_coop (q8_act.wgsl) into YQ, the down
// projection's Q8 row: the bits silu_mul.wgsl + quantize_q8.wgsl write in a batch step, without
// the quantize dispatch. Called by every invocation (barriers); li = j * LANES + lane.
//   5 storage rw    YQ: array<vec4<u32>>  one Q8 row of n_ff = P.rows / 2 values

@group(0) @binding(5) var<storage, read_write> YQ: array<vec4<u32>>;

var<workgroup> pair_sum: array<f32, ROWS>;

// output j of the workgroup: silu_mul.wgsl's expression on the row sums of rows 2j, 2j + 1
fn silu_at(j: u32) -> f32 {
    let g = pair_sum[2u * j];
    let u = pair_sum[2u * j + 1u];
    return g / (1.0 + exp(-g)) * u;
}

fn finish(r: u32, j: u32, lane: u32, v: f32) {
    if (lane == 0u) {
        pair_sum[j] = v;
    }
    workgroupBarrier();
    let w = p.rows >> 1u;
    if (lane == 0u && (j & 1u) == 0u && r + 1u < p.rows) {
        let e = r >> 1u;
        Y[p.y_off + (((e >> 2u) & 7u) * (w >> 5u) + (e >> 5u)) * 4u + (e & 3u)] = silu_at(j >> 1u);
    }
    // thread li < ROWS / 8 quantizes outputs 4 li .. 4 li + 3 of the workgroup (8 per block)
    let li = j * LANES + lane;
    let e0 = ((r - j) >> 1u) + 4u * li;
    let live = li < ROWS / 8u && e0 < w;
    var x = vec4<f32>(0.0);
    if (live) {
        x = vec4<f32>(silu_at(4u * li), silu_at(4u * li + 1u), silu_at(4u * li + 2u), silu_at(4u * li + 3u));
    }
    let q = q8_coop(li, x);
    if (live) {
        let b = e0 / 32u;
        let k = (e0 / 4u) % 8u;
        YQ[2u * b + k / 4u][k % 4u] = q.word;
        if (k == 0u) {
            YQ[2u * (w / 32u) + b] = q.sums;
        }
    }
}
