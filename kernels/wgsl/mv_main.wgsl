// mv_main.wgsl — entry point of matmul_vec.wgsl: lane sums added by a workgroup-memory tree
// (strides LANES/2, ..., 1), matmul.wgsl's tree; the result goes to `finish` (mv_y_*.wgsl).

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let lane = li % LANES;
    let r = wg.x * ROWS + li / LANES;
    part[li] = lane_partial(li, r, lane);
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
        if (lane < st) {
            part[li] = part[li] + part[li + st];
        }
        workgroupBarrier();
    }
    finish(r, li / LANES, lane, part[li]);
}
