//! The tensor-core (cooperative matrix) matmul of the layer runner: which adapters take it, its
//! pipelines and its grid (kernels/wgsl/matmul_coop.wgsl; `WgpuOptions::coop`). Q4_0 matrices
//! whose rows are a multiple of [`ROWS`] multiply on it in steps of every size, so that a
//! token's bits do not depend on its batch (plan.rs).

use super::pipeline::{kernel, Kernel, B};
use super::WgpuError;
use crate::gguf::GgmlType;

/// The weight types the kernel is built for (its dequantization is Q4_0's).
pub(super) const TYPES: [GgmlType; 1] = [GgmlType::Q4_0];

/// What matmul_coop.wgsl needs of a device.
pub(super) const FEATURES: wgpu::Features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX.union(wgpu::Features::SHADER_F16);

/// Whether `adapter` runs matmul_coop.wgsl: cooperative matrices of 16 x 16 x 16 with f16
/// operands and f32 accumulators, and subgroups of exactly 32 (the kernel's subgroup of an
/// invocation is its index / 32).
pub(super) fn capable(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    adapter.features().contains(FEATURES)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16) && p.ab_type == wgpu::CooperativeScalarType::F16 && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Subgroups (of 32) along the rows and the tokens of matmul_coop.wgsl's two tiles: 64 x 32 (steps
/// below `WgpuOptions::coop_wide` tokens) and 128 x 64.
pub(crate) const TILES: [(u32, u32); 2] = [(2, 1), (4, 2)];

/// Rows of a matrix that matmul_coop.wgsl takes: a multiple of both tiles' rows.
pub(crate) const ROWS: usize = 128;

/// Tokens of the large tile: the runner's activation rows are rounded up to a multiple of it,
/// since a tile writes all its tokens' rows.
pub(crate) const TOKENS: usize = 64;

/// matmul_coop.wgsl's two tiles for weights of type `ty` after `weights`, the type's
/// `load_chunk` source (context.rs `matmul_weight_source`).
pub(super) fn kernels(device: &wgpu::Device, ty: GgmlType, weights: &str, checks: bool) -> Result<[Kernel; 2], WgpuError> {
    let mm = [B::Uniform, B::Read, B::Read, B::Rw];
    let mm_io = include_str!("../../../kernels/wgsl/mm_io.wgsl");
    let src = include_str!("../../../kernels/wgsl/matmul_coop.wgsl");
    let (m_line, n_line) = ("const WGM: u32 = 4u;", "const WGN: u32 = 2u;");
    let [small, big] = TILES.map(|(wgm, wgn)| {
        let name = format!("matmul_coop_{}_{wgm}x{wgn}", ty.name());
        if !src.contains(m_line) || !src.contains(n_line) {
            return Err(WgpuError::Shader { kernel: name, msg: "WGM / WGN lines not found".into() });
        }
        let tile = src.replace(m_line, &format!("const WGM: u32 = {wgm}u;")).replace(n_line, &format!("const WGN: u32 = {wgn}u;"));
        kernel(device, &name, &format!("enable f16;\nenable wgpu_cooperative_matrix;\n{weights}\n{mm_io}\n{tile}"), &mm, checks)
    });
    Ok([small?, big?])
}

/// Workgroups of matmul_coop.wgsl (tile `wide`: the 128 x 64 one) for `rows` outputs of `n_tok` tokens.
pub(crate) fn grid(rows: usize, n_tok: usize, wide: bool) -> (u32, u32) {
    let (wgm, wgn) = TILES[wide as usize];
    ((rows / (32 * wgm as usize)) as u32, n_tok.div_ceil(32 * wgn as usize) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants the runner relies on agree with the tiles: every tile's rows divide
    /// [`ROWS`], every tile's tokens divide [`TOKENS`], and the grid covers a step exactly.
    #[test]
    fn tiles_fit_the_constants() {
        for (wgm, wgn) in TILES {
            assert_eq!(ROWS % (32 * wgm as usize), 0);
            assert_eq!(TOKENS % (32 * wgn as usize), 0);
        }
        assert_eq!(grid(2560, 512, true), (20, 8));
        assert_eq!(grid(2560, 1, false), (40, 1));
        assert_eq!(grid(128, 65, true), (1, 2));
    }
}
