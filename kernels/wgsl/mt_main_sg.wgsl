// mt_main_sg.wgsl — entry point of matmul_tile.wgsl for subgroups of exactly LANES = 32
// invocations (device feature SUBGROUP): one subgroup per group of rows, its lane the subgroup
// invocation id. A lane holds 32 sums, sum j = 4 t + r in a<t>.<r> (row r0 + r, token t0 + t).
// The tree of mt_main.wgsl (strides 16, 8, 4, 2, 1) as a reduce-scatter: at stride st each lane
// holds 2 st sums; lane l keeps the half of them whose index has bit st equal to lane bit st,
// sends the other half to lane l ^ st and adds what it receives: kept + received, for the lower
// lane of the pair the tree's part[l] + part[l + st], for the upper one the same two operands
// swapped, the same bits (float addition commutes). 31 shuffles per lane instead of 5 per sum;
// at the end lane l holds sum l (row r0 + l % 4, token t0 + l / 4), the tree's bits, and stores it.

fn finish(li: u32, lane: u32, r0: u32, t0: u32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>) {
    // stride 16: t bit 2
    var up = (lane & 16u) != 0u;
    let b0 = select(a0, a4, up) + subgroupShuffleXor(select(a4, a0, up), 16u);
    let b1 = select(a1, a5, up) + subgroupShuffleXor(select(a5, a1, up), 16u);
    let b2 = select(a2, a6, up) + subgroupShuffleXor(select(a6, a2, up), 16u);
    let b3 = select(a3, a7, up) + subgroupShuffleXor(select(a7, a3, up), 16u);
    // stride 8: t bit 1
    up = (lane & 8u) != 0u;
    let c0 = select(b0, b2, up) + subgroupShuffleXor(select(b2, b0, up), 8u);
    let c1 = select(b1, b3, up) + subgroupShuffleXor(select(b3, b1, up), 8u);
    // stride 4: t bit 0
    up = (lane & 4u) != 0u;
    let d = select(c0, c1, up) + subgroupShuffleXor(select(c1, c0, up), 4u);
    // stride 2: r bit 1
    up = (lane & 2u) != 0u;
    let e = select(d.xy, d.zw, up) + subgroupShuffleXor(select(d.zw, d.xy, up), 2u);
    // stride 1: r bit 0
    up = (lane & 1u) != 0u;
    let f = select(e.x, e.y, up) + subgroupShuffleXor(select(e.y, e.x, up), 1u);
    let r = r0 + lane % 4u;
    let t = t0 + lane / 4u;
    if (t < p.n_tok && r < p.rows) {
        put(r, t, f);
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
