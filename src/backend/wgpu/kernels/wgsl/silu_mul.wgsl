// silu_mul.wgsl — G = silu(G) * U = (G / (1 + exp(-G))) * U, elementwise, in place.
//
// Bindings (group 0):
//   0 uniform P { n, _, _, _ }
//   1 storage rw    G: array<f32>  [n]
//   2 storage read  U: array<f32>  [n]
// Dispatch: one thread per element, 256 per workgroup, workgroups (x, y) with linear index
// y * num_workgroups.x + x.

struct P {
    n: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> G: array<f32>;
@group(0) @binding(2) var<storage, read> U: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    if (i < p.n) {
        let g = G[i];
        G[i] = g / (1.0 + exp(-g)) * U[i];
    }
}
