// mv_x_silu.wgsl — x source of matmul_vec.wgsl with SiLU·mul folded in: xv(c, k) = silu(g) * u with
// g, u the (8c + k)-th vec4 of the gate and up halves of the fused gate|up row, the expression of
// silu_mul.wgsl element by element (the same bits).
//   2 storage read  X: array<vec4<f32>>  [2 * cols] gate values, then up values (cols = n_ff)

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

fn prepare(li: u32) {}

fn xv(c: u32, k: u32) -> vec4<f32> {
    let i = c * 8u + k;
    let g = X[i];
    return g / (1.0 + exp(-g)) * X[i + p.cols / 4u];
}
