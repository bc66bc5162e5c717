// mv_y_store.wgsl — `finish` of matmul_vec.wgsl: row r's sum (held by lane 0 of its row) is stored
// as it is: Y[y_off + r] written, or added to (accumulate = 1). No bindings of its own.
// finish(r, j, lane, v): r the row, j its index in the workgroup, lane the lane, v the row's sum
// in lane 0; called by every invocation.

fn finish(r: u32, j: u32, lane: u32, v: f32) {
    if (r < p.rows && lane == 0u) {
        store(r, v);
    }
}
