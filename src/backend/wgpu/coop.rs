//! The tensor-core (cooperative matrix) matmuls of the layer runner: which adapters take them,
//! their pipelines and grids (`WgpuOptions::coop`): kernels/wgsl/matmul_coop.wgsl for steps of
//! several tokens, matvec_coop.wgsl for one, with the same bits. Q4_0 matrices whose rows are a
//! multiple of [`ROWS`] multiply on them in steps of every size, so that a token's bits do not
//! depend on its batch (plan.rs).

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

/// Rows of a matrix that the tensor-core matmuls take: a multiple of both tiles' rows and of
/// [`ONE_TOKEN_ROWS`].
pub(crate) const ROWS: usize = 128;

/// Tokens of the large tile: the runner's activation rows are rounded up to a multiple of it,
/// since a tile writes all its tokens' rows.
pub(crate) const TOKENS: usize = 64;

/// Rows per workgroup of matvec_coop.wgsl.
pub(crate) const ONE_TOKEN_ROWS: usize = 16;

/// Values of K per range: both kernels sum each range's products apart, from zero, and add the
/// ranges' partial sums in order (matmul_coop.wgsl's header), so that matvec_coop.wgsl can run
/// the ranges of one token side by side. A multiple of 32 (it sets the bits). Chosen with
/// [`ONE_TOKEN_SUBGROUPS`] on the H200 (docs/perf.md).
pub(crate) const K_RANGE: u32 = 128;

/// Subgroups of matvec_coop.wgsl, each one range at a time (the same bits for any count).
pub(crate) const ONE_TOKEN_SUBGROUPS: u32 = 8;

/// `src` with its line `const {name}: u32 = ..;` set to `value`, or the kernel's error if the
/// line is missing.
fn set_const(src: &str, kernel: &str, name: &str, value: u32) -> Result<String, WgpuError> {
    let head = format!("const {name}: u32 = ");
    let missing = || WgpuError::Shader { kernel: kernel.into(), msg: format!("no line {head:?}..;") };
    // (at a line's start: a comment naming the constant is not its line)
    let at = src.match_indices(&head).map(|(i, _)| i).find(|&i| i == 0 || src[..i].ends_with('\n')).ok_or_else(missing)? + head.len();
    let end = at + src[at..].find(';').ok_or_else(missing)?;
    Ok(format!("{}{value}u{}", &src[..at], &src[end..]))
}

/// The tensor-core kernels of one weight type.
pub(crate) struct CoopKernels {
    /// matmul_coop.wgsl's 64 x 32 and 128 x 64 tiles (steps of several tokens)
    pub tiles: [Kernel; 2],
    /// matvec_coop.wgsl (steps of one token)
    pub one: Kernel,
}

/// The tensor-core kernels for weights of type `ty` after `weights`, the type's `load_chunk`
/// source (context.rs `matmul_weight_source`).
pub(super) fn kernels(device: &wgpu::Device, ty: GgmlType, weights: &str, checks: bool) -> Result<CoopKernels, WgpuError> {
    let mm = [B::Uniform, B::Read, B::Read, B::Rw];
    let [(one_name, one_src), (small_name, small_src), (big_name, big_src)] = sources(ty, weights)?;
    Ok(CoopKernels {
        tiles: [kernel(device, &small_name, &small_src, &mm, checks)?, kernel(device, &big_name, &big_src, &mm, checks)?],
        one: kernel(device, &one_name, &one_src, &mm, checks)?,
    })
}

/// The names and composed WGSL of matvec_coop.wgsl and of matmul_coop.wgsl's two tiles (in
/// [`TILES`] order) for weights of type `ty` after `weights`: the `enable` lines, the weights'
/// source, mm_io.wgsl, coop_q4_0.wgsl and the kernel with its constants set.
fn sources(ty: GgmlType, weights: &str) -> Result<[(String, String); 3], WgpuError> {
    let head = format!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n{weights}\n{}\n{}",
        include_str!("../../../kernels/wgsl/mm_io.wgsl"),
        include_str!("../../../kernels/wgsl/coop_q4_0.wgsl")
    );
    let name = format!("matvec_coop_{}", ty.name());
    let src = set_const(include_str!("../../../kernels/wgsl/matvec_coop.wgsl"), &name, "KR", K_RANGE)?;
    let src = set_const(&src, &name, "SG", ONE_TOKEN_SUBGROUPS)?;
    let one = (name, format!("{head}\n{src}"));
    let src = include_str!("../../../kernels/wgsl/matmul_coop.wgsl");
    let [small, big] = TILES.map(|(wgm, wgn)| {
        let name = format!("matmul_coop_{}_{wgm}x{wgn}", ty.name());
        let tile = set_const(src, &name, "WGM", wgm)?;
        let tile = set_const(&tile, &name, "WGN", wgn)?;
        let tile = set_const(&tile, &name, "KR", K_RANGE)?;
        Ok((name, format!("{head}\n{tile}")))
    });
    Ok([one, small?, big?])
}

/// Workgroups of matmul_coop.wgsl (tile `wide`: the 128 x 64 one) for `rows` outputs of `n_tok` tokens.
pub(crate) fn grid(rows: usize, n_tok: usize, wide: bool) -> (u32, u32) {
    let (wgm, wgn) = TILES[wide as usize];
    ((rows / (32 * wgm as usize)) as u32, n_tok.div_ceil(32 * wgn as usize) as u32)
}

/// Workgroups of matvec_coop.wgsl for `rows` outputs of one token.
pub(crate) fn one_token_grid(rows: usize) -> (u32, u32) {
    ((rows / ONE_TOKEN_ROWS) as u32, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants the runner relies on agree with the tiles: every tile's rows divide
    /// [`ROWS`], every tile's tokens divide [`TOKENS`], and the grid covers a step exactly; the
    /// one-token kernel's rows divide [`ROWS`].
    #[test]
    fn tiles_fit_the_constants() {
        for (wgm, wgn) in TILES {
            assert_eq!(ROWS % (32 * wgm as usize), 0);
            assert_eq!(TOKENS % (32 * wgn as usize), 0);
        }
        assert_eq!(grid(2560, 512, true), (20, 8));
        assert_eq!(grid(2560, 1, false), (40, 1));
        assert_eq!(grid(128, 65, true), (1, 2));
        assert_eq!(ROWS % ONE_TOKEN_ROWS, 0);
        assert_eq!(one_token_grid(11264), (704, 1));
    }

    /// The tensor-core kernels as the runner composes them parse and validate (naga, with the
    /// cooperative-matrix and f16 capabilities): their `const_assert`s hold for the constants set
    /// here (matvec_coop.wgsl's register slots among them), and their cooperative-matrix
    /// operations sit in uniform control flow. Runs without a GPU: CI's lavapipe has no
    /// cooperative matrices, so the kernels are never built there.
    #[test]
    fn kernels_validate_without_a_gpu() {
        use wgpu::naga;
        for ty in TYPES {
            for (name, src) in sources(ty, &super::super::context::matmul_weight_source(ty)).expect("constants found") {
                let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
                let caps = naga::valid::Capabilities::COOPERATIVE_MATRIX | naga::valid::Capabilities::SHADER_FLOAT16 | naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            }
        }
        // a constant line that is not there is an error, not a silent no-op
        assert_eq!(set_const("const KR: u32 = 128u;\nconst X: u32 = 1u;", "k", "KR", 64).expect("set"), "const KR: u32 = 64u;\nconst X: u32 = 1u;");
        assert!(set_const("const KR: u32 = 128u;", "k", "SG", 64).is_err());
        assert!(set_const("// const SG: u32 = 8u;", "k", "SG", 64).is_err());
    }
}
