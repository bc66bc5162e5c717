// mt_main_sg.wgsl — entry point of matmul_tile.wgsl for subgroups of exactly LANES (= 32)
// invocations (device feature SUBGROUP): one subgroup per group of rows, its lane the subgroup
// invocation id. mt_main.wgsl's tree by shuffles: at stride st lane l adds lane l ^ st's value,
// for l < st the tree's part[l] + part[l + st]; float addition commutes, so lanes l and l ^ st
// hold the same bits after every stage and every lane ends with the tree's sum (mv_main_sg.wgsl).
// Lane j < TR stores row r0 + j.

fn finish(li: u32, lane: u32, r0: u32, t: u32, live: bool, v: array<f32, TR>) {
    for (var j = 0u; j < TR; j++) {
        var s = v[j];
        for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
            s = s + subgroupShuffleXor(s, st);
        }
        if (live && lane == j && r0 + j < p.rows) {
            put(r0 + j, t, s);
        }
    }
}

@compute @workgroup_size(256)
fn main(
    @builtin(local_invocation_index) li: u32,
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) sg: u32,
) {
    tile(li, lane, sg, wg);
}
