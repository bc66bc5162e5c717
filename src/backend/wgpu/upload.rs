//! Weight matrices uploaded for the layer runner (layers.rs): stacked when they feed one
//! destination row (q|k|v, gate|up), repacked for the types pack.rs handles, and gate|up rows
//! interleaved in pairs where the decode matmul has the SiLU·mul epilogue (mv_y_silu.wgsl).

use super::context::{WgpuContext, XSrc};
use super::pack;
use super::WgpuError;
use crate::backend::offload::LayerTensors;
use crate::backend::WeightView;
use crate::gguf::GgmlType;

/// One layer's weights on the GPU.
pub(super) struct GpuLayer {
    /// [n_embd] f32
    pub attn_norm: wgpu::Buffer,
    /// wq|wk|wv stacked when they share a type, else the three
    pub qkv: Vec<GpuMatrix>,
    /// [n_embd, n_head * head_dim] attention output projection
    pub wo: GpuMatrix,
    /// [n_embd] f32
    pub ffn_norm: wgpu::Buffer,
    /// w_gate|w_up stacked when they share a type, else the two
    pub gate_up: Vec<GpuMatrix>,
    /// [n_embd, n_ff] FFN down projection
    pub w_down: GpuMatrix,
    /// [2, head_dim] f32: the q norm weight, then the k norm weight (rmsnorm_heads.wgsl), when
    /// the model has q/k norms
    pub qk_norm: Option<wgpu::Buffer>,
    /// [n_embd] f32 norms of the o and down projections' outputs before they are added to the
    /// residual stream (Gemma's post-attention and post-FFN norms), when the model has them
    pub post_attn_norm: Option<wgpu::Buffer>,
    /// [n_embd] f32 (see above: the FFN output's norm)
    pub post_ffn_norm: Option<wgpu::Buffer>,
}

impl GpuLayer {
    /// Every matrix of the layer: q|k|v, gate|up, o and down.
    pub(super) fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        self.qkv.iter().chain(&self.gate_up).chain([&self.wo, &self.w_down])
    }

    /// Uploads layer `li`'s tensors `lw`.
    pub(super) fn upload(ctx: &WgpuContext, li: usize, lw: &LayerTensors<'_>) -> Result<GpuLayer, WgpuError> {
        let norm = |v: &[f32], name: &str| ctx.storage_init(&format!("blk.{li}.{name}"), bytemuck::cast_slice(v));
        let qk_norm = match (lw.q_norm, lw.k_norm) {
            (Some(q), Some(k)) if q.len() == k.len() => Some(ctx.storage_concat(&format!("blk.{li}.attn_qk_norm"), &[bytemuck::cast_slice(q), bytemuck::cast_slice(k)])?),
            (None, None) => None,
            _ => return Err(WgpuError::Unsupported(format!("blk.{li}: a q norm without a k norm of the same width"))),
        };
        Ok(GpuLayer {
            attn_norm: norm(lw.attn_norm, "attn_norm")?,
            qkv: upload_rows(ctx, &[lw.wq, lw.wk, lw.wv], &format!("blk.{li}.attn_qkv"), false)?,
            wo: upload_rows(ctx, &[lw.wo], &format!("blk.{li}.attn_output"), false)?.remove(0),
            ffn_norm: norm(lw.ffn_norm, "ffn_norm")?,
            gate_up: upload_rows(ctx, &[lw.w_gate, lw.w_up], &format!("blk.{li}.ffn_gate_up"), true)?,
            w_down: upload_rows(ctx, &[lw.w_down], &format!("blk.{li}.ffn_down"), false)?.remove(0),
            qk_norm,
            post_attn_norm: lw.post_attn_norm.map(|v| norm(v, "post_attention_norm")).transpose()?,
            post_ffn_norm: lw.post_ffn_norm.map(|v| norm(v, "post_ffw_norm")).transpose()?,
        })
    }

    /// Bytes of the layer's matrices on the GPU.
    pub(super) fn bytes(&self) -> u64 {
        self.qkv.iter().chain(&self.gate_up).chain([&self.wo, &self.w_down]).map(|m| m.buf.size()).sum()
    }
}

/// Weight rows on the GPU: one matrix, or several of one type stacked (q|k|v, gate|up) so that
/// a single dispatch computes them all.
pub(super) struct GpuMatrix {
    /// raw GGUF blocks [rows, row_bytes], or repacked (pack.rs; then `row_bytes` is chunks per row)
    pub buf: wgpu::Buffer,
    /// weight type of the rows
    pub ty: GgmlType,
    /// number of rows (outputs)
    pub rows: usize,
    /// elements per row (inputs)
    pub cols: usize,
    /// bytes per row (chunks per row when repacked: see `buf`)
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
pub(super) fn upload_rows(ctx: &WgpuContext, views: &[WeightView<'_>], name: &str, pair: bool) -> Result<Vec<GpuMatrix>, WgpuError> {
    if let Some(v) = views.iter().find(|v| v.cols % 32 != 0 || v.cols != views[0].cols) {
        return Err(WgpuError::Unsupported(format!("{name}: rows of {} values (need a multiple of 32, all alike)", v.cols)));
    }
    let row_bytes = |v: &WeightView<'_>| pack::row_param(v.ty, v.cols, v.row_bytes());
    let gm = |buf, ty, rows, v: &WeightView<'_>, y_off, pairs| GpuMatrix { buf, ty, rows, cols: v.cols, row_bytes: row_bytes(v), y_off, pairs };
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
