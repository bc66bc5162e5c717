// add.wgsl — residual add: X += Y, elementwise, in place (bitwise equal to the CPU's f32 add).
//
// Bindings (group 0):
//   0 uniform P { n, _, _, _ }
//   1 storage rw    X: array<f32>  [n]
//   2 storage read  Y: array<f32>  [n]
// Dispatch: one thread per element, 256 per workgroup, workgroups (x, y) with linear index
// y * num_workgroups.x + x.

struct P {
    n: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    if (i < p.n) {
        X[i] = X[i] + Y[i];
    }
}
