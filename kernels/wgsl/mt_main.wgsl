// mt_main.wgsl — entry point of matmul_tile.wgsl: the lane sums added by a workgroup-memory tree
// (strides LANES / 2, ..., 1: matmul.wgsl's tree, the same bits), token by token, the four rows
// of a group as one vec4, stored by lane 0.

var<workgroup> part: array<vec4<f32>, 256>;

// v.<j>: this lane's sum of row r0 + j, token t (stored where t < P.n_tok). Every invocation
// calls it (it holds workgroup barriers).
fn finish_tok(li: u32, lane: u32, r0: u32, t: u32, v: vec4<f32>) {
    part[li] = v;
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
        if (lane < st) {
            part[li] = part[li] + part[li + st];
        }
        workgroupBarrier();
    }
    if (t < p.n_tok && lane == 0u) {
        let v = part[li];
        for (var j = 0u; j < TR; j++) {
            if (r0 + j < p.rows) {
                put(r0 + j, t, v[j]);
            }
        }
    }
    workgroupBarrier();
}

fn finish(li: u32, lane: u32, r0: u32, t0: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>) {
    finish_tok(li, lane, r0, t0, a0);
    finish_tok(li, lane, r0, t0 + 1u, a1);
    finish_tok(li, lane, r0, t0 + 2u, a2);
    finish_tok(li, lane, r0, t0 + 3u, a3);
    finish_tok(li, lane, r0, t0 + 4u, a4);
    finish_tok(li, lane, r0, t0 + 5u, a5);
    finish_tok(li, lane, r0, t0 + 6u, a6);
    finish_tok(li, lane, r0, t0 + 7u, a7);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    tile(li, li % LANES, li / LANES, wg);
}
