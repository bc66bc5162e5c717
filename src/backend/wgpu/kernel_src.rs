//! Assembly of WGSL sources for the pipelines of [`build_kernels`](super::context): the
//! `LANES` / `ROWS` lines of the matmuls, and matmul_wide.wgsl's variants and grid.

use super::pipeline::WG;
use super::WgpuError;
use crate::gguf::GgmlType;

/// Rows and tokens per workgroup of matmul_wide.wgsl (its `RW`, `TW`).
const WIDE_ROWS: usize = 64;
const WIDE_TOKENS: usize = 32;

/// `src` with its `LANES` / `ROWS` lines set for `lanes` threads per row.
pub(super) fn with_lanes(name: &str, src: &str, lanes: u32) -> Result<String, WgpuError> {
    let (l_line, r_line) = ("const LANES: u32 = 32u;", "const ROWS: u32 = 8u;");
    if !src.contains(l_line) || !src.contains(r_line) {
        return Err(WgpuError::Shader { kernel: name.into(), msg: "LANES / ROWS lines not found".into() });
    }
    Ok(src.replace(l_line, &format!("const LANES: u32 = {lanes}u;")).replace(r_line, &format!("const ROWS: u32 = {}u;", WG / lanes)))
}

/// matmul_wide.wgsl for weights of type `ty` (after its weight decoder, chunk_q8 and
/// mm_io.wgsl): Raw.q1 is Q8_0's second 16 bytes only, the 4-bit types stage no such word.
pub(super) fn wide_source(ty: GgmlType) -> String {
    let src = include_str!("../../../kernels/wgsl/matmul_wide.wgsl");
    match ty {
        GgmlType::Q8_0 => src.to_string(),
        _ => src.replace("const HAS_Q1: bool = true;", "const HAS_Q1: bool = false;"),
    }
}

/// Workgroups of matmul_wide.wgsl for `rows` outputs of `n_tok` tokens.
pub(super) fn wide_grid(rows: usize, n_tok: usize) -> (u32, u32) {
    (rows.div_ceil(WIDE_ROWS) as u32, n_tok.div_ceil(WIDE_TOKENS) as u32)
}
