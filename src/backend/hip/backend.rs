//! [`HipBackend`]: the `Backend` trait on the HIP kernels, one op at a time (operands uploaded,
//! the result read back). The engine runs HIP layers through `HipLayers`; this exists so that the
//! kernel tests run one test body on every backend present, the CPU's scalar reference first.
//! Ops HIP has no kernel for (LayerNorm, GELU: BERT's) run on the CPU's scalar kernels, and
//! `supports` says so. A failing launch falls back to the CPU result and is kept for
//! [`HipBackend::take_error`], so a test sees it.

use std::sync::{Arc, Mutex};


use super::kernels::{type_info, ActRef, AttGroup, Epi, MatRef, Tile, ATT_CH, Q8_BYTES};
use super::runtime::DevBuf;
use super::{HipContext, HipError};
use crate::backend::cpu::ops as cpu_ops;
use crate::backend::{AttentionArgs, Backend, Op, WeightView};
use crate::gguf::GgmlType;

pub struct HipBackend {
    ctx: Arc<HipContext>,
    tile: Option<Tile>,
    att_grouped: Option<AttGroup>,
    error: Mutex<Option<HipError>>,
}

impl HipBackend {
    pub fn new(ctx: Arc<HipContext>) -> HipBackend {
        HipBackend { ctx, tile: None, att_grouped: None, error: Mutex::new(None) }
    }

    /// Every matmul on `tile` (None: chosen by the number of tokens).
    pub fn with_tile(mut self, tile: Option<Tile>) -> HipBackend {
        self.tile = tile;
        self
    }

    /// Attention's chunk kernel spread this way (None: `AttGroup::choose`, by the number of tokens and of KV-head CTAs).
    pub fn with_attention_groups(mut self, grouped: Option<AttGroup>) -> HipBackend {
        self.att_grouped = grouped;
        self
    }

    /// The first error since the last call, if any.
    pub fn take_error(&self) -> Option<HipError> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn keep(&self, r: Result<(), HipError>) {
        if let Err(e) = r {
            let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
            g.get_or_insert(e);
        }
    }

    /// Dequantizes rows `ids` of `w` on the device (the embedding lookup kernel).
    pub fn embed(&self, w: WeightView<'_>, ids: &[u32], out: &mut [f32]) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let rt = self.ctx.runtime();
        let wb = DevBuf::from_bytes(rt, w.data)?;
        let idb = DevBuf::from_bytes(rt, bytemuck::cast_slice(ids))?;
        let ob = DevBuf::new(rt, out.len() * 4)?;
        let m = MatRef { ptr: wb.ptr(), ty: w.ty, rows: w.rows, cols: w.cols, row_bytes: w.row_bytes() };
        self.ctx.kernels().embed(&**rt, &m, idb.ptr(), ids.len(), ob.ptr())?;
        ob.read_f32(out)
    }

    fn try_matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let wb = DevBuf::from_bytes(rt, w.data)?;
        let xb = DevBuf::from_f32(rt, x)?;
        let q8 = !type_info(w.ty).ok_or_else(|| HipError::Unsupported(format!("{} weights", w.ty.name())))?.float_act;
        let xq = DevBuf::new(rt, if q8 { n_tok * w.cols / 32 * Q8_BYTES } else { 4 })?;
        if q8 {
            k.quantize(&**rt, xb.ptr(), w.cols, xq.ptr(), n_tok)?;
        }
        let ob = DevBuf::new(rt, out.len() * 4)?;
        let m = MatRef { ptr: wb.ptr(), ty: w.ty, rows: w.rows, cols: w.cols, row_bytes: w.row_bytes() };
        k.matmul(&**rt, &m, ActRef { f32: xb.ptr(), q8: xq.ptr() }, n_tok, ob.ptr(), w.rows, Epi::Store, self.tile)?;
        ob.read_f32(out)
    }

    fn try_rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let e = weight.len();
        let (xb, wb, ob) = (DevBuf::from_f32(rt, x)?, DevBuf::from_f32(rt, weight)?, DevBuf::new(rt, out.len() * 4)?);
        k.rmsnorm(&**rt, xb.ptr(), wb.ptr(), e, eps, Some(ob.ptr()), None, x.len() / e.max(1))?;
        ob.read_f32(out)
    }

    fn try_rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let (xb, tb, pb) = (DevBuf::from_f32(rt, x)?, DevBuf::from_f32(rt, cos_sin)?, DevBuf::from_bytes(rt, bytemuck::cast_slice(positions))?);
        k.rope(&**rt, xb.ptr(), n_head, head_dim, tb.ptr(), pb.ptr(), positions.len())?;
        xb.read_f32(x)
    }

    fn try_attention(&self, a: &mut AttentionArgs<'_>) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let n = a.positions.len();
        let qb = DevBuf::from_f32(rt, a.q)?;
        let bits = |c: &[half::f16]| -> Vec<u16> { c.iter().map(|h| h.to_bits()).collect() };
        let kb = DevBuf::from_bytes(rt, bytemuck::cast_slice(&bits(a.k_cache)))?;
        let vb = DevBuf::from_bytes(rt, bytemuck::cast_slice(&bits(a.v_cache)))?;
        let tok: Vec<u64> = a.positions.iter().flat_map(|&p| [kb.ptr(), vb.ptr(), a.capacity as u64 | ((p as u64) << 32)]).collect();
        let tb = DevBuf::from_bytes(rt, bytemuck::cast_slice(&tok))?;
        let max_pos = a.positions.iter().copied().max().unwrap_or(0) as usize;
        let chunks = (max_pos + 1).div_ceil(ATT_CH);
        let part = DevBuf::new(rt, n * a.n_head * chunks * (a.head_dim + 2) * 4)?;
        let ob = DevBuf::new(rt, a.out.len() * 4)?;
        let qd = a.n_head * a.head_dim;
        k.attention(&**rt, qb.ptr(), qd, (a.n_head, a.n_kv_head, a.head_dim), tb.ptr(), 0, part.ptr(), chunks, ob.ptr(), None, n, self.att_grouped)?;
        ob.read_f32(a.out)
    }

    fn try_binary(&self, x: &mut [f32], y: &[f32], silu: bool) -> Result<(), HipError> {
        let _stream = self.ctx.lock();
        let (rt, k) = (self.ctx.runtime(), self.ctx.kernels());
        let (xb, yb) = (DevBuf::from_f32(rt, x)?, DevBuf::from_f32(rt, y)?);
        if silu {
            k.silu_mul(&**rt, xb.ptr(), yb.ptr(), x.len())?;
        } else {
            k.add(&**rt, xb.ptr(), yb.ptr(), x.len())?;
        }
        xb.read_f32(x)
    }
}

impl Backend for HipBackend {
    fn name(&self) -> String {
        let t = self.tile.map(|t| format!(", matmul tile {t:?}")).unwrap_or_default();
        format!("hip {}{t}", self.ctx.describe())
    }

    fn supports(&self, op: Op, _ty: GgmlType) -> bool {
        !matches!(op, Op::LayerNorm | Op::Gelu)
    }

    fn matmul(&self, w: WeightView<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
        if let Err(e) = self.try_matmul(w, x, n_tok, out) {
            self.keep(Err(e));
            for t in 0..n_tok {
                for r in 0..w.rows {
                    let mut row = vec![0f32; w.cols];
                    crate::gguf::dequantize_row(w.ty, w.row(r), &mut row);
                    out[t * w.rows + r] = row.iter().zip(&x[t * w.cols..(t + 1) * w.cols]).map(|(a, b)| a * b).sum();
                }
            }
        }
    }

    fn rmsnorm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
        if let Err(e) = self.try_rmsnorm(x, weight, eps, out) {
            self.keep(Err(e));
            for (xr, or) in x.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
                cpu_ops::rmsnorm(xr, weight, eps, or);
            }
        }
    }

    fn layernorm(&self, x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
        for (xr, or) in x.chunks_exact(weight.len()).zip(out.chunks_exact_mut(weight.len())) {
            cpu_ops::layernorm(xr, weight, bias, eps, or);
        }
    }

    fn rope(&self, x: &mut [f32], positions: &[u32], n_head: usize, head_dim: usize, cos_sin: &[f32]) {
        let r = self.try_rope(x, positions, n_head, head_dim, cos_sin);
        self.keep(r);
    }

    fn attention(&self, mut args: AttentionArgs<'_>) {
        let r = self.try_attention(&mut args);
        self.keep(r);
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        let r = self.try_binary(gate, up, true);
        self.keep(r);
    }

    fn gelu(&self, x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = cpu_ops::gelu(*v);
        }
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        let r = self.try_binary(x, y, false);
        self.keep(r);
    }
}

