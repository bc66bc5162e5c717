// mm_io.wgsl — the parameters, weights and outputs that matmul.wgsl and matmul_tile.wgsl share
// (bindings 0, 1 and 3 of matmul.wgsl's header; binding 2, X, comes with the input part),
// prepended to either at pipeline creation.

struct P {
    rows: u32,
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    y_stride: u32,
    y_off: u32,
    accumulate: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<WT>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
