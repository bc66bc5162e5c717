// mt_main_sg.wgsl — entry point of matmul_tile.wgsl for subgroups of exactly LANES = 32
// invocations (device feature SUBGROUP) and TR * TT = 32 sums per lane: one subgroup per group of
// rows, its lane the subgroup invocation id. The tree of mt_main.wgsl (strides 16, 8, 4, 2, 1) as
// a reduce-scatter: at stride st each lane holds 2 st sums; lane l keeps the half of them whose
// index has bit st equal to lane bit st, sends the other half to lane l ^ st and adds what it
// receives: kept + received, for the lower lane of the pair the tree's part[l] + part[l + st],
// for the upper one the same two operands swapped, the same bits (float addition commutes).
// 31 shuffles per lane instead of 5 per sum; at the end lane l holds sum l (row r0 + l / TT,
// token t0 + l % TT), the very bits of the tree, and stores it.

fn finish(li: u32, lane: u32, r0: u32, t0: u32, nt: u32, acc: array<f32, 32>) {
    var v = acc;
    var up = false;
    up = (lane & 16u) != 0u;
    for (var k = 0u; k < 16u; k++) {
        v[k] = select(v[k], v[k + 16u], up) + subgroupShuffleXor(select(v[k + 16u], v[k], up), 16u);
    }
    up = (lane & 8u) != 0u;
    for (var k = 0u; k < 8u; k++) {
        v[k] = select(v[k], v[k + 8u], up) + subgroupShuffleXor(select(v[k + 8u], v[k], up), 8u);
    }
    up = (lane & 4u) != 0u;
    for (var k = 0u; k < 4u; k++) {
        v[k] = select(v[k], v[k + 4u], up) + subgroupShuffleXor(select(v[k + 4u], v[k], up), 4u);
    }
    up = (lane & 2u) != 0u;
    for (var k = 0u; k < 2u; k++) {
        v[k] = select(v[k], v[k + 2u], up) + subgroupShuffleXor(select(v[k + 2u], v[k], up), 2u);
    }
    up = (lane & 1u) != 0u;
    for (var k = 0u; k < 1u; k++) {
        v[k] = select(v[k], v[k + 1u], up) + subgroupShuffleXor(select(v[k + 1u], v[k], up), 1u);
    }
    let r = lane / TT;
    let t = lane % TT;
    if (t < nt && r0 + r < p.rows) {
        put(r0 + r, t0 + t, v[0]);
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
