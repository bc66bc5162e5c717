// mv_main_sg.wgsl — entry point of matmul_vec.wgsl for subgroups of exactly LANES (= 32)
// invocations (device feature SUBGROUP): one subgroup per row, its lane the
// subgroup invocation id. The tree of mv_main.wgsl by shuffles: at stride st lane l adds lane
// l ^ st's value; for l < st that is l + st, so lane l holds the same sum (same operands, same
// order) as mv_main.wgsl's part[l], and lane 0 ends with the same bits, handed to `finish`
// (mv_y_*.wgsl).

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let r = wg.x * ROWS + sg;
    var v = lane_partial(li, r, lane);
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
        v = v + subgroupShuffleXor(v, st);
    }
    finish(r, sg, lane, v);
}
