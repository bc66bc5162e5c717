//! The dispatches of a one-token step (decode) in the layer runner: matmul_vec.wgsl instead of
//! the batch matmul, with RMSNorm folded into the q|k|v and gate|up matmuls and SiLU·mul into the
//! down projection (`DecodePlan::Fused`: 6 dispatches per layer instead of 9). Where gate|up rows
//! are interleaved (upload.rs), SiLU·mul is instead the epilogue of the gate|up matmul
//! (mv_y_silu.wgsl), writing the down projection's input: 8 dispatches per layer unfused, 6
//! fused. The decode kernels
//! keep the batch kernels' reduction orders, so a token's bits do not depend on which list ran it
//! (tests: `wgpu_layers_decode_equals_prefill_bitwise`, tests/batch_invariance.rs).

use super::context::{DecodePlan, Kernel, Kernels, XSrc};
use super::layers::{GpuLayer, GpuMatrix, Step};
use super::WgpuError;

/// One dispatch of a layer's plan: (before attention, kernel, step, label, buffers of bindings 1..).
pub(super) type PlanItem<'a> = (bool, &'a Kernel, Step, &'static str, Vec<&'a wgpu::Buffer>);

/// The activation buffers a layer's dispatches read and write.
pub(super) struct Acts<'a> {
    /// [n_embd] residual stream
    pub x: &'a wgpu::Buffer,
    /// [n_embd] normalized
    pub xn: &'a wgpu::Buffer,
    pub qkv: &'a wgpu::Buffer,
    pub att: &'a wgpu::Buffer,
    /// [2 * n_ff] gate|up
    pub gu: &'a wgpu::Buffer,
    /// [n_ff] SiLU(gate)·up
    pub act: &'a wgpu::Buffer,
}

/// The one-token dispatches of layer `g` (empty for `DecodePlan::Off`); `norm` is the RMSNorm step.
pub(super) fn layer_plan<'a>(kern: &'a Kernels, plan: DecodePlan, g: &'a GpuLayer, a: &Acts<'a>, norm: Step) -> Result<Vec<PlanItem<'a>>, WgpuError> {
    let eps = match norm {
        Step::RmsNorm { eps, .. } => eps,
        _ => 0.0,
    };
    let mv = |w: &GpuMatrix, xs: XSrc, accumulate: bool| -> Result<(&'a Kernel, Step), WgpuError> {
        let k = kern.matvec.get(&(w.ty, xs)).ok_or_else(|| WgpuError::Unsupported(format!("decode matmul of {}", w.ty.name())))?;
        let step = Step::MatVec { rows: w.rows, cols: w.cols, row_bytes: w.row_bytes, y_off: w.y_off, accumulate, eps: if xs == XSrc::Norm { eps } else { 0.0 } };
        Ok((k, step))
    };
    // gate|up with the SiLU·mul epilogue (rows interleaved at upload): (kernel, step)
    let gu_silu = |xs: XSrc| -> Result<Option<(&'a Kernel, Step)>, WgpuError> {
        let Some(w) = g.gate_up.first().filter(|w| w.pairs) else { return Ok(None) };
        let k = kern.matvec_silu.get(&(w.ty, xs)).ok_or_else(|| WgpuError::Unsupported(format!("decode gate|up + silu of {}", w.ty.name())))?;
        Ok(Some((k, mv(w, xs, false)?.1)))
    };
    let mut p: Vec<PlanItem<'a>> = Vec::new();
    match plan {
        DecodePlan::Off => {}
        DecodePlan::Unfused => {
            p.push((true, &kern.rmsnorm, norm, "rmsnorm", vec![a.x, &g.attn_norm, a.xn]));
            for w in &g.qkv {
                let (k, s) = mv(w, XSrc::Plain, false)?;
                p.push((true, k, s, "matvec qkv", vec![&w.buf, a.xn, a.qkv]));
            }
            let (k, s) = mv(&g.wo, XSrc::Plain, true)?;
            p.push((false, k, s, "matvec o + add", vec![&g.wo.buf, a.att, a.x]));
            p.push((false, &kern.rmsnorm, norm, "rmsnorm", vec![a.x, &g.ffn_norm, a.xn]));
            if let Some((k, s)) = gu_silu(XSrc::Plain)? {
                p.push((false, k, s, "matvec gate_up + silu_mul", vec![&g.gate_up[0].buf, a.xn, a.act]));
            } else {
                for w in &g.gate_up {
                    let (k, s) = mv(w, XSrc::Plain, false)?;
                    p.push((false, k, s, "matvec gate_up", vec![&w.buf, a.xn, a.gu]));
                }
                p.push((false, &kern.silu_mul, Step::SiluMul { pairs: false }, "silu_mul", vec![a.gu, a.gu, a.act]));
            }
            let (k, s) = mv(&g.w_down, XSrc::Plain, true)?;
            p.push((false, k, s, "matvec down + add", vec![&g.w_down.buf, a.act, a.x]));
        }
        DecodePlan::Fused => {
            for w in &g.qkv {
                let (k, s) = mv(w, XSrc::Norm, false)?;
                p.push((true, k, s, "norm + matvec qkv", vec![&w.buf, a.x, a.qkv, &g.attn_norm]));
            }
            let (k, s) = mv(&g.wo, XSrc::Plain, true)?;
            p.push((false, k, s, "matvec o + add", vec![&g.wo.buf, a.att, a.x]));
            if let Some((k, s)) = gu_silu(XSrc::Norm)? {
                p.push((false, k, s, "norm + matvec gate_up + silu_mul", vec![&g.gate_up[0].buf, a.x, a.act, &g.ffn_norm]));
                let (k, s) = mv(&g.w_down, XSrc::Plain, true)?;
                p.push((false, k, s, "matvec down + add", vec![&g.w_down.buf, a.act, a.x]));
            } else {
                for w in &g.gate_up {
                    let (k, s) = mv(w, XSrc::Norm, false)?;
                    p.push((false, k, s, "norm + matvec gate_up", vec![&w.buf, a.x, a.gu, &g.ffn_norm]));
                }
                let (k, s) = mv(&g.w_down, XSrc::Silu, true)?;
                p.push((false, k, s, "silu_mul + matvec down + add", vec![&g.w_down.buf, a.gu, a.x]));
            }
        }
    }
    Ok(p)
}
