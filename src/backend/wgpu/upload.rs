//! Weight matrices uploaded for the layer runner (layers.rs): stacked when they feed one
//! destination row (q|k|v, gate|up), repacked for the types pack.rs handles, and gate|up rows
//! interleaved in pairs where the decode matmul has the SiLU·mul epilogue (mv_y_silu.wgsl).

use super::context::{WgpuContext, XSrc};
use super::pack;
use super::WgpuError;
use crate::engine::weights::Matrix;
use crate::engine::Model;
use crate::gguf::GgmlType;

/// Weight rows on the GPU: one matrix, or several of one type stacked (q|k|v, gate|up) so that
/// a single dispatch computes them all.
pub(super) struct GpuMatrix {
    /// raw GGUF blocks [rows, row_bytes], or repacked (pack.rs; then `row_bytes` is chunks per row)
    pub buf: wgpu::Buffer,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// First output column of these rows in the destination row.
    pub y_off: usize,
    /// gate|up with rows interleaved: row 2i is gate row i, row 2i + 1 up row i (so one
    /// workgroup of the decode matmul owns both operands of output i; silu_mul.wgsl's `pair`).
    pub pairs: bool,
}

/// Uploads matrices that feed one destination row (q|k|v or gate|up): stacked in one buffer when
/// they share a type (one dispatch), else one buffer each; `y_off` places each in the row.
/// `pair`: two matrices of one type and shape (gate, up) are interleaved row by row when the
/// context has the decode matmul with the SiLU·mul epilogue for their type.
pub(super) fn upload_rows(ctx: &WgpuContext, model: &Model, mats: &[&Matrix], name: &str, pair: bool) -> Result<Vec<GpuMatrix>, WgpuError> {
    let views: Vec<_> = mats.iter().map(|m| m.view(&model.gguf)).collect();
    if let Some(v) = views.iter().find(|v| v.cols % 32 != 0 || v.cols != views[0].cols) {
        return Err(WgpuError::Unsupported(format!("{name}: rows of {} values (need a multiple of 32, all alike)", v.cols)));
    }
    let row_bytes = |v: &crate::backend::WeightView<'_>| pack::row_param(v.ty, v.cols, v.row_bytes());
    let gm = |buf, ty, rows, v: &crate::backend::WeightView<'_>, y_off, pairs| GpuMatrix { buf, ty, rows, cols: v.cols, row_bytes: row_bytes(v), y_off, pairs };
    // packed types (pack.rs) are repacked on the host first; the rest goes up as it is
    let upload = |parts: &[&[u8]], ty, cols| match pack::packed(ty) {
        true => ctx.storage_init(name, &pack::pack_rows(ty, cols, parts)),
        false => ctx.storage_concat(name, parts),
    };
    if views.iter().all(|v| v.ty == views[0].ty) {
        let (ty, rows) = (views[0].ty, views.iter().map(|v| v.rows).sum());
        let pairs = pair && views.len() == 2 && views[0].rows == views[1].rows && ctx.kernels.matvec_silu.contains_key(&(ty, XSrc::Plain));
        let parts: Vec<&[u8]> = match pairs {
            // row i of each, in turn: gate 0, up 0, gate 1, up 1, ...
            true => {
                let rb = views[0].row_bytes();
                views[0].data.chunks_exact(rb).zip(views[1].data.chunks_exact(rb)).flat_map(|(g, u)| [g, u]).collect()
            }
            false => views.iter().map(|v| v.data).collect(),
        };
        return Ok(vec![gm(upload(&parts, ty, views[0].cols)?, ty, rows, &views[0], 0, pairs)]);
    }
    let mut y_off = 0;
    views
        .iter()
        .map(|v| {
            let m = gm(upload(&[v.data], v.ty, v.cols)?, v.ty, v.rows, v, y_off, false);
            y_off += v.rows;
            Ok(m)
        })
        .collect()
}
