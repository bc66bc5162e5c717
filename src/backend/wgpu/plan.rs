//! The token-wide dispatches of a layer in the layer runner (layers.rs), for batch steps
//! ([`batch_plan`]) and for steps of one token ([`one_token_plan`], decode).
//!
//! Matrices of the repacked types (Q4_0, Q4_1, Q8_0; pack.rs) multiply activations quantized to 8
//! bits (q8_act.wgsl, the CPU engine's BlockQ8) by integer dot products: their input is written as
//! Q8 rows by rmsnorm_q8.wgsl, silu_mul_q8.wgsl (the down projection's) or quantize_q8.wgsl, and matmul.wgsl after mm_x_q8.wgsl (batch) or matvec_q8.wgsl
//! (one token) multiply. Other types read f32 activations (matmul.wgsl, matmul_vec.wgsl). A group
//! of mixed types gets both inputs.
//!
//! Q4_0 matrices multiply on tensor cores where the adapter has them (`WgpuOptions::coop`: f32
//! activations rounded to f16 in the kernel): matmul_coop.wgsl in batch steps, matvec_coop.wgsl
//! (the same bits) for one token, whose plan is then the unfused one.
//!
//! One-token steps use the decode kernels (matvec*.wgsl) with the batch kernels' reduction orders,
//! so a token's bits do not depend on which list ran it (tests: `wgpu_layers_decode_equals_prefill_bitwise`,
//! tests/batch_invariance.rs). Where gate|up rows are interleaved (upload.rs), SiLU·mul is the
//! epilogue of the decode gate|up matmul (mv_y_silu.wgsl). `DecodePlan::Fused` (f32 activations
//! only: RMSNorm folded into q|k|v and gate|up, SiLU·mul into the down projection) applies to
//! layers without Q8 matrices.

use super::context::{Kernels, XSrc, STAGE_MAX_COLS};
use super::pipeline::Kernel;
use super::options::DecodePlan;
use super::pack::packed;
use super::upload::{GpuLayer, GpuMatrix};
use super::WgpuError;
use crate::gguf::GgmlType;

/// What one token-wide dispatch computes; with the batch size it gives the parameters and grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Step {
    /// `accumulate`: add into the destination (the residual stream) instead of writing; `wide`:
    /// the weight type where steps of `WgpuOptions::tile_wide` tokens and more run
    /// matmul_wide.wgsl instead of matmul_tile.wgsl, or with `coop` (matmul_coop.wgsl) where
    /// steps of `WgpuOptions::coop_wide` tokens and more take its large tile (the same bits;
    /// layers.rs picks per step).
    MatMul { rows: usize, cols: usize, row_bytes: usize, y_stride: usize, y_off: usize, accumulate: bool, tile: bool, wide: Option<GgmlType>, coop: bool },
    /// One token's matmul on the tensor cores (matvec_coop.wgsl: matmul_coop.wgsl's bits) of a
    /// matrix that [`takes_coop`]; `accumulate` as MatMul's.
    CoopVec { rows: usize, cols: usize, row_bytes: usize, y_off: usize, accumulate: bool },
    /// One token's matmul (matmul_vec.wgsl); `eps` for a folded RMSNorm (mv_x_norm.wgsl,
    /// mvq_x_stage.wgsl).
    MatVec { rows: usize, cols: usize, row_bytes: usize, y_off: usize, accumulate: bool, eps: f32 },
    /// rmsnorm.wgsl or rmsnorm_q8.wgsl (same parameters)
    RmsNorm { dim: usize, eps: f32 },
    /// rmsnorm.wgsl with `add`: a post-norm of a projection's output added to the residual stream
    PostNorm { dim: usize, eps: f32 },
    /// quantize_q8.wgsl: rows of `cols` (swizzled or plain) to Q8 rows
    Quantize { cols: usize, swizzle: bool },
    /// silu_mul.wgsl, or silu_mul_q8.wgsl when `q8` (Q8 rows out); `pairs`: gate and up
    /// interleaved (upload.rs)
    SiluMul { pairs: bool, q8: bool },
    /// rmsnorm_heads.wgsl: q/k norms in place in the q|k|v rows (`row` values wide), `n_q` query
    /// heads then `heads - n_q` key heads of `head_dim`
    HeadNorm { head_dim: usize, heads: usize, n_q: usize, row: usize, eps: f32 },
}

/// Bytes of `n_tok` Q8 rows of `cols` values (q8_act.wgsl: 48 bytes per block of 32).
pub(crate) fn q8_bytes(n_tok: usize, cols: usize) -> u64 {
    (n_tok * cols.div_ceil(32) * 48) as u64
}

/// Whether `w` multiplies on the tensor cores (matmul_coop.wgsl, built where
/// `WgpuOptions::coop` applies): its type has the kernel and its rows fill the tiles. Such a
/// matrix reads f32 activations, in steps of every size.
pub(super) fn takes_coop(kern: &Kernels, w: &GpuMatrix) -> bool {
    coop_kernels(kern, w).is_some()
}

/// The tensor-core kernels of `w` where it [`takes_coop`].
fn coop_kernels<'k>(kern: &'k Kernels, w: &GpuMatrix) -> Option<&'k super::coop::CoopKernels> {
    kern.matmul_coop.get(&w.ty).filter(|_| w.rows.is_multiple_of(super::coop::ROWS))
}

/// One dispatch of a layer's plan: (before attention, kernel, step, label, buffers of bindings 1..).
pub(super) type PlanItem<'a> = (bool, &'a Kernel, Step, &'static str, Vec<&'a wgpu::Buffer>);

/// A matmul's kernel, step and buffers (weights, input) before its output is added.
type MatmulItem<'a> = (&'a Kernel, Step, Vec<&'a wgpu::Buffer>);

/// The activation buffers a layer's dispatches read and write.
pub(super) struct Acts<'a> {
    /// [n_tok, n_embd] residual stream
    pub x: &'a wgpu::Buffer,
    /// [n_tok, n_embd] normalized (f32, swizzled)
    pub xn: &'a wgpu::Buffer,
    /// [n_tok] Q8 rows of the next Q8 matmul's input (q8_act.wgsl)
    pub xq: &'a wgpu::Buffer,
    /// [n_tok, n_head*hd + 2*kv_dim] fused q|k|v rows
    pub qkv: &'a wgpu::Buffer,
    /// [n_tok, n_head*hd] attention output
    pub att: &'a wgpu::Buffer,
    /// [n_tok, 2 * n_ff] gate|up
    pub gu: &'a wgpu::Buffer,
    /// [n_tok, n_ff] SiLU(gate)·up
    pub act: &'a wgpu::Buffer,
    /// [n_tok, n_embd] a projection's output before its post-norm
    pub proj: &'a wgpu::Buffer,
}

/// Rows from which a tiled matmul is the wide kernel (matmul_wide.wgsl, 64 rows x 32 tokens per
/// workgroup) in steps of `WgpuOptions::tile_wide` tokens and more: below it too few workgroups fill the GPU.
/// H100, prefill of 512 tokens, GPU ms wide / narrow (docs/perf.md): SmolLM2-shaped gate|up
/// (3072 rows) 1.89 / 2.60, q|k|v (960) 0.77 / 0.98, o (576) 0.80 / 0.68, down (576) 1.54 / 1.11;
/// 1.1B (2048 .. 11264 rows) 25.2 / 25.8 over its four matmuls. The same bits either way.
pub(super) const WIDE_MIN_ROWS: usize = 768;

/// What the plans need besides the layer and the buffers.
pub(super) struct PlanCtx<'a> {
    /// the compiled pipelines
    pub kern: &'a Kernels,
    /// integer-dot matmuls for the repacked types
    pub q8: bool,
    /// the batch Q8 matmuls are the tiled kernel (matmul_tile.wgsl: its own grid)
    pub tile: bool,
    /// the tiled matmuls of at least [`WIDE_MIN_ROWS`] rows may run matmul_wide.wgsl
    /// (`Kernels::matmul_wide`) in large steps, where they have fewer columns than this (0: none)
    pub wide_cols: usize,
    /// attention writes its output as Q8 rows too (kv.rs `attention_q8`)
    pub att_q8: bool,
    /// one-token matmuls stage their own Q8 input where they can (mvq_x_stage.wgsl)
    pub stage: bool,
    /// the one-token q|k|v matmul does RoPE + KV store where it can (mv_y_rope.wgsl)
    pub qkv_rope: bool,
    /// the one-token o projection folds a split attention's partials where it can (mvq_x_merge.wgsl)
    pub o_merge: bool,
    /// width of the residual stream
    pub n_embd: usize,
    /// [n_embd] RMSNorm of the layer's inputs
    pub norm: Step,
    /// destination row widths of q|k|v and gate|up
    pub qkv_width: usize,
    /// destination row width of gate|up (2 * n_ff)
    pub gu_width: usize,
    /// the q/k norms' step (rmsnorm_heads.wgsl), run where a layer has their weights
    pub head_norm: Step,
    /// the post-attention / post-FFN norms' step (rmsnorm.wgsl's `add`)
    pub post_norm: Step,
}

impl<'a> PlanCtx<'a> {
    fn uses_q8(&self, w: &GpuMatrix) -> bool {
        self.q8 && packed(w.ty) && !takes_coop(self.kern, w)
    }

    /// The norm dispatches before `ws` (f32 and / or Q8 output, as the matrices read).
    fn norm(&self, p: &mut Vec<PlanItem<'a>>, pre: bool, ws: &[GpuMatrix], x: &'a wgpu::Buffer, g: &'a wgpu::Buffer, a: &Acts<'a>) {
        if ws.iter().any(|w| !self.uses_q8(w)) {
            p.push((pre, &self.kern.rmsnorm, self.norm, "rmsnorm", vec![x, g, a.xn]));
        }
        if ws.iter().any(|w| self.uses_q8(w)) {
            p.push((pre, &self.kern.rmsnorm_q8, self.norm, "rmsnorm q8", vec![x, g, a.xq]));
        }
    }

    /// The q/k norms after the q|k|v matmul, where layer `g` has them (before RoPE: attention
    /// and rope_store read the rows after them).
    fn head_norm(&self, p: &mut Vec<PlanItem<'a>>, g: &'a GpuLayer, a: &Acts<'a>) {
        if let Some(w) = &g.qk_norm {
            p.push((true, &self.kern.rmsnorm_heads, self.head_norm, "q/k norm", vec![a.qkv, w]));
        }
    }

    /// The o or down projection `item` and its output's way into the residual stream `a.x`: added
    /// by the matmul itself, or with a post-norm weight `post` written to `a.proj`, normalized and
    /// added (the CPU engine's `residual_add`).
    fn residual(&self, p: &mut Vec<PlanItem<'a>>, item: MatmulItem<'a>, label: &'static str, post: Option<&'a wgpu::Buffer>, a: &Acts<'a>) {
        let (k, mut s, mut b) = item;
        match post {
            None => {
                b.push(a.x);
                p.push((false, k, s, label, b));
            }
            Some(w) => {
                if let Step::MatMul { accumulate, .. } | Step::MatVec { accumulate, .. } | Step::CoopVec { accumulate, .. } = &mut s {
                    *accumulate = false;
                }
                b.push(a.proj);
                p.push((false, k, s, label, b));
                p.push((false, &self.kern.rmsnorm, self.post_norm, "post-norm + add", vec![a.proj, w, a.x]));
            }
        }
    }

    /// quantize_q8 of `src` (swizzled rows of `cols`) into `xq` when `w` reads Q8.
    fn quantize(&self, p: &mut Vec<PlanItem<'a>>, w: &GpuMatrix, src: &'a wgpu::Buffer, a: &Acts<'a>) {
        if self.uses_q8(w) {
            p.push((false, &self.kern.quantize_q8, Step::Quantize { cols: w.cols, swizzle: true }, "quantize q8", vec![src, a.xq]));
        }
    }

    /// SiLU·mul of `a.gu` as the down projection `w_down` reads it: Q8 rows straight into `a.xq`
    /// (silu_mul_q8.wgsl) when it multiplies by integer dots, f32 rows into `a.act` otherwise.
    fn silu_mul(&self, p: &mut Vec<PlanItem<'a>>, pairs: bool, w_down: &GpuMatrix, a: &Acts<'a>) {
        if self.uses_q8(w_down) {
            p.push((false, &self.kern.silu_mul_q8, Step::SiluMul { pairs, q8: true }, "silu_mul q8", vec![a.gu, a.gu, a.xq]));
        } else {
            p.push((false, &self.kern.silu_mul, Step::SiluMul { pairs, q8: false }, "silu_mul", vec![a.gu, a.gu, a.act]));
        }
    }

    /// The o projection's Q8 input, unless attention wrote it (`att_q8`).
    fn quantize_att(&self, p: &mut Vec<PlanItem<'a>>, wo: &GpuMatrix, a: &Acts<'a>) {
        if !self.att_q8 {
            self.quantize(p, wo, a.att, a);
        }
    }

    /// The batch matmul of `w` reading `x` (f32) or `a.xq` (Q8).
    fn matmul(&self, w: &'a GpuMatrix, x: &'a wgpu::Buffer, a: &Acts<'a>, y_stride: usize, accumulate: bool) -> Result<MatmulItem<'a>, WgpuError> {
        if let Some(k) = coop_kernels(self.kern, w).map(|c| &c.tiles[0]) {
            let step = Step::MatMul { rows: w.rows, cols: w.cols, row_bytes: w.row_bytes, y_stride, y_off: w.y_off, accumulate, tile: false, wide: Some(w.ty), coop: true };
            return Ok((k, step, vec![&w.buf, x]));
        }
        let q8 = self.uses_q8(w);
        let wide = (q8 && self.tile && w.rows >= WIDE_MIN_ROWS && w.cols < self.wide_cols && self.kern.matmul_wide.contains_key(&w.ty)).then_some(w.ty);
        let step = Step::MatMul { rows: w.rows, cols: w.cols, row_bytes: w.row_bytes, y_stride, y_off: w.y_off, accumulate, tile: q8 && self.tile, wide, coop: false };
        let (map, x) = match (q8, self.tile) {
            (true, true) => (&self.kern.matmul_tile, a.xq),
            (true, false) => (&self.kern.matmul_q8, a.xq),
            (false, _) => (&self.kern.matmul, x),
        };
        let k = map.get(&w.ty).ok_or_else(|| WgpuError::Unsupported(w.ty.name().into()))?;
        Ok((k, step, vec![&w.buf, x]))
    }
}

/// The token-wide dispatches of layer `g` for a batch step (any number of tokens).
pub(super) fn batch_plan<'a>(pc: &PlanCtx<'a>, g: &'a GpuLayer, a: &Acts<'a>) -> Result<Vec<PlanItem<'a>>, WgpuError> {
    let mut p: Vec<PlanItem<'a>> = Vec::new();
    pc.norm(&mut p, true, &g.qkv, a.x, &g.attn_norm, a);
    for w in &g.qkv {
        let (k, s, mut b) = pc.matmul(w, a.xn, a, pc.qkv_width, false)?;
        b.push(a.qkv);
        p.push((true, k, s, "matmul qkv", b));
    }
    pc.head_norm(&mut p, g, a);
    pc.quantize_att(&mut p, &g.wo, a);
    pc.residual(&mut p, pc.matmul(&g.wo, a.att, a, pc.n_embd, true)?, "matmul o + add", g.post_attn_norm.as_ref(), a);
    pc.norm(&mut p, false, &g.gate_up, a.x, &g.ffn_norm, a);
    for w in &g.gate_up {
        let (k, s, mut b) = pc.matmul(w, a.xn, a, pc.gu_width, false)?;
        b.push(a.gu);
        p.push((false, k, s, "matmul gate_up", b));
    }
    let pairs = g.gate_up.iter().any(|w| w.pairs);
    pc.silu_mul(&mut p, pairs, &g.w_down, a);
    pc.residual(&mut p, pc.matmul(&g.w_down, a.act, a, pc.n_embd, true)?, "matmul down + add", g.post_ffn_norm.as_ref(), a);
    Ok(p)
}

/// The one-token dispatches of a layer (see [`one_token_plan`]).
pub(super) struct OneToken<'a> {
    /// the token-wide dispatches (empty for `DecodePlan::Off`: the batch plan runs)
    pub list: Vec<PlanItem<'a>>,
    /// the q|k|v matmul with RoPE + KV store as its epilogue when it replaces the list's q|k|v
    /// matmul and rope_store (a staged, fused q|k|v matrix; buffers of bindings 1-4, kv.rs adds
    /// the sequence's: it is recorded per sequence)
    pub rope: Option<PlanItem<'a>>,
    /// the o projection reading a split attention's partials (mvq_x_merge.wgsl; buffers of
    /// bindings 1 and 3, kv.rs adds the sequence's), and the index among the list's dispatches
    /// after attention of the plain o projection it replaces when the sequence's attention is
    /// split (then no attention_merge runs)
    pub o_merge: Option<(usize, PlanItem<'a>)>,
}

/// The one-token dispatches of layer `g` ([`OneToken`]).
pub(super) fn one_token_plan<'a>(pc: &PlanCtx<'a>, plan: DecodePlan, g: &'a GpuLayer, a: &Acts<'a>) -> Result<OneToken<'a>, WgpuError> {
    let kern = pc.kern;
    let eps = match pc.norm {
        Step::RmsNorm { eps, .. } => eps,
        _ => 0.0,
    };
    // Tensor-core matrices (matvec_coop.wgsl) read normalized f32 rows, like Q8 ones read Q8
    // rows: the norm is a dispatch of its own.
    let norm_apart = g.matrices().any(|w| pc.uses_q8(w) || takes_coop(kern, w));
    let plan = if plan == DecodePlan::Fused && norm_apart { DecodePlan::Unfused } else { plan };
    // q|k|v normalize and quantize their own input (mvq_x_stage.wgsl) where every matrix of the
    // group reads Q8 and the row fits the workgroup's buffer: no rmsnorm_q8 dispatch before them.
    // Only there: measured on the H100 (1.1B), the staged q|k|v took 0.249 ms per step against
    // 0.350 for rmsnorm_q8 + matvec, while staging gate|up (1408 workgroups each normalizing the
    // row) took 0.599 against 0.437 and the down projection's input 0.390 against 0.357.
    let staged = |ws: &[GpuMatrix]| pc.stage && ws.iter().all(|w| pc.uses_q8(w) && w.cols <= STAGE_MAX_COLS);
    // (x source, input buffer) of the decode matmul of `w`: `xs` for f32 inputs, Q8 rows in
    // `a.xq` for the Q8 types, or with `staged` the residual stream `x` (normalized by the kernel)
    let pick = |w: &'a GpuMatrix, xs: XSrc, x: &'a wgpu::Buffer, staged: bool| match (pc.uses_q8(w), staged) {
        (true, true) => (XSrc::Q8Stage, x),
        (true, false) => (XSrc::Q8, a.xq),
        (false, _) => (xs, x),
    };
    let step_of = |w: &GpuMatrix, xs: XSrc, accumulate: bool| Step::MatVec {
        rows: w.rows,
        cols: w.cols,
        row_bytes: w.row_bytes,
        y_off: w.y_off,
        accumulate,
        eps: if matches!(xs, XSrc::Norm | XSrc::Q8Stage) { eps } else { 0.0 },
    };
    // (kernel, step, [weights, input]) of the decode matmul of `w`
    let mv = |w: &'a GpuMatrix, xs: XSrc, x: &'a wgpu::Buffer, accumulate: bool, staged: bool| -> Result<MatmulItem<'a>, WgpuError> {
        if let Some(c) = coop_kernels(kern, w) {
            let step = Step::CoopVec { rows: w.rows, cols: w.cols, row_bytes: w.row_bytes, y_off: w.y_off, accumulate };
            return Ok((&c.one, step, vec![&w.buf, x]));
        }
        let (xs, x) = pick(w, xs, x, staged);
        let k = kern.matvec.get(&(w.ty, xs)).ok_or_else(|| WgpuError::Unsupported(format!("decode matmul of {}", w.ty.name())))?;
        Ok((k, step_of(w, xs, accumulate), vec![&w.buf, x]))
    };
    // gate|up with the SiLU·mul epilogue (rows interleaved at upload; not on the tensor cores)
    let gu_silu = |xs: XSrc, x: &'a wgpu::Buffer| -> Result<Option<MatmulItem<'a>>, WgpuError> {
        let Some(w) = g.gate_up.first().filter(|w| w.pairs && !takes_coop(kern, w)) else { return Ok(None) };
        let (xs, x) = pick(w, xs, x, false);
        let k = kern.matvec_silu.get(&(w.ty, xs)).ok_or_else(|| WgpuError::Unsupported(format!("decode gate|up + silu of {}", w.ty.name())))?;
        Ok(Some((k, step_of(w, xs, false), vec![&w.buf, x])))
    };
    let mut p: Vec<PlanItem<'a>> = Vec::new();
    let mut rope = None;
    let mut o_merge = None;
    let with = |mut b: Vec<&'a wgpu::Buffer>, more: &[&'a wgpu::Buffer]| {
        b.extend_from_slice(more);
        b
    };
    // the output, then for a staged input binding 4: the norm weight (read with mode 1 only)
    let out = |mut b: Vec<&'a wgpu::Buffer>, y: &'a wgpu::Buffer, st: bool, g: &'a wgpu::Buffer| {
        b.push(y);
        if st {
            b.push(g);
        }
        b
    };
    match plan {
        DecodePlan::Off => {}
        DecodePlan::Unfused => {
            let qkv_st = staged(&g.qkv);
            if !qkv_st {
                pc.norm(&mut p, true, &g.qkv, a.x, &g.attn_norm, a);
            }
            let roped = match (&g.qkv[..], pc.qkv_rope && qkv_st) {
                ([w], true) if w.y_off == 0 => pc.kern.matvec_rope.get(&w.ty).map(|k| (w, k)),
                _ => None,
            };
            if let Some((w, k)) = roped {
                rope = Some((true, k, step_of(w, XSrc::Q8Stage, false), "norm + matvec qkv + rope + kv store", vec![&w.buf, a.x, a.qkv, &g.attn_norm]));
            }
            for w in g.qkv.iter().filter(|_| rope.is_none()) {
                let (k, s, b) = mv(w, XSrc::Plain, if qkv_st { a.x } else { a.xn }, false, qkv_st)?;
                p.push((true, k, s, if qkv_st { "norm + matvec qkv" } else { "matvec qkv" }, out(b, a.qkv, qkv_st, &g.attn_norm)));
            }
            pc.head_norm(&mut p, g, a);
            pc.quantize_att(&mut p, &g.wo, a);
            // the o projection straight from the partials: Q8 input as attention writes it,
            // a row the stage holds, added to the residual stream by the matmul itself
            if pc.o_merge && pc.att_q8 && pc.uses_q8(&g.wo) && g.wo.cols <= STAGE_MAX_COLS && g.post_attn_norm.is_none() {
                if let Some(k) = kern.matvec.get(&(g.wo.ty, XSrc::Q8Merge)) {
                    let at = p.iter().filter(|i| !i.0).count();
                    o_merge = Some((at, (false, k, step_of(&g.wo, XSrc::Q8Merge, true), "matvec o + merge + add", vec![&g.wo.buf, a.x])));
                }
            }
            pc.residual(&mut p, mv(&g.wo, XSrc::Plain, a.att, true, false)?, "matvec o + add", g.post_attn_norm.as_ref(), a);
            pc.norm(&mut p, false, &g.gate_up, a.x, &g.ffn_norm, a);
            if let Some((k, s, b)) = gu_silu(XSrc::Plain, a.xn)? {
                p.push((false, k, s, "matvec gate_up + silu_mul", with(b, &[a.act])));
                pc.quantize(&mut p, &g.w_down, a.act, a);
            } else {
                for w in &g.gate_up {
                    let (k, s, b) = mv(w, XSrc::Plain, a.xn, false, false)?;
                    p.push((false, k, s, "matvec gate_up", with(b, &[a.gu])));
                }
                // (interleaved rows here only on the tensor cores)
                pc.silu_mul(&mut p, g.gate_up.iter().any(|w| w.pairs), &g.w_down, a);
            }
            pc.residual(&mut p, mv(&g.w_down, XSrc::Plain, a.act, true, false)?, "matvec down + add", g.post_ffn_norm.as_ref(), a);
        }
        DecodePlan::Fused => {
            for w in &g.qkv {
                let (k, s, b) = mv(w, XSrc::Norm, a.x, false, false)?;
                p.push((true, k, s, "norm + matvec qkv", with(b, &[a.qkv, &g.attn_norm])));
            }
            pc.head_norm(&mut p, g, a);
            pc.residual(&mut p, mv(&g.wo, XSrc::Plain, a.att, true, false)?, "matvec o + add", g.post_attn_norm.as_ref(), a);
            if let Some((k, s, b)) = gu_silu(XSrc::Norm, a.x)? {
                p.push((false, k, s, "norm + matvec gate_up + silu_mul", with(b, &[a.act, &g.ffn_norm])));
                pc.residual(&mut p, mv(&g.w_down, XSrc::Plain, a.act, true, false)?, "matvec down + add", g.post_ffn_norm.as_ref(), a);
            } else {
                for w in &g.gate_up {
                    let (k, s, b) = mv(w, XSrc::Norm, a.x, false, false)?;
                    p.push((false, k, s, "norm + matvec gate_up", with(b, &[a.gu, &g.ffn_norm])));
                }
                pc.residual(&mut p, mv(&g.w_down, XSrc::Silu, a.gu, true, false)?, "silu_mul + matvec down + add", g.post_ffn_norm.as_ref(), a);
            }
        }
    }
    Ok(OneToken { list: p, rope, o_merge })
}
