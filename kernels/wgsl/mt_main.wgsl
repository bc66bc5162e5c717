// mt_main.wgsl — entry point of matmul_tile.wgsl: the lane sums added by a workgroup-memory tree
// (strides LANES / 2, ..., 1: matmul.wgsl's tree, the same bits), token by token; lane j < TR of
// a group stores row r0 + j.

var<workgroup> part: array<f32, 1024>;

// acc[r * TT + t]: this lane's sum of row r0 + r, token t0 + t (tokens t < nt stored). Every
// invocation calls it (it holds workgroup barriers).
fn finish(li: u32, lane: u32, r0: u32, t0: u32, nt: u32, acc: array<f32, TR * TT>) {
    for (var t = 0u; t < TT; t++) {
        for (var j = 0u; j < TR; j++) {
            part[j * 256u + li] = acc[j * TT + t];
        }
        workgroupBarrier();
        for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
            if (lane < st) {
                for (var j = 0u; j < TR; j++) {
                    let i = j * 256u + li;
                    part[i] = part[i] + part[i + st];
                }
            }
            workgroupBarrier();
        }
        if (t < nt && lane < TR && r0 + lane < p.rows) {
            put(r0 + lane, t0 + t, part[lane * 256u + li - lane]);
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    tile(li, li % LANES, li / LANES, wg);
}
