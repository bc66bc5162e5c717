//! Model weights: read-only views into the GGUF memory map, located and shape-checked once at
//! load. Matrices are never copied (a fused matrix is split into row ranges of the same bytes);
//! only the tiny norm and bias vectors are dequantized to f32.
//!
//! Every tensor of the file must be one the architecture uses: an unknown tensor is an error
//! naming it (as llama.cpp refuses a file with tensors it does not load).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock};

use crate::backend::{Backend, Prepared, WeightView};
use crate::gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

use super::config::ModelConfig;

/// A weight matrix in the map: `rows` outputs × `cols` inputs (GGML dims [cols, rows]), rows
/// `row0..row0 + rows` of its tensor.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// The GGUF tensor this matrix is (part of).
    pub info: TensorInfo,
    /// Number of output rows.
    pub rows: usize,
    /// Elements per row (inputs).
    pub cols: usize,
    /// First row of this matrix within the tensor (non-zero for the parts of a fused matrix).
    pub row0: usize,
    /// The backend's own copy in its kernels' layout ([`Backend::prepare`]), made once, at load
    /// or by the engine thread before its first step ([`Weights::prepare`]).
    pub prepared: OnceLock<Arc<Prepared>>,
}

impl Matrix {
    pub fn view<'a>(&'a self, g: &'a GgufFile) -> WeightView<'a> {
        let rb = self.info.ty.row_bytes(self.cols).unwrap_or(0);
        let data = &g.data(&self.info)[self.row0 * rb..(self.row0 + self.rows) * rb];
        WeightView { ty: self.info.ty, rows: self.rows, cols: self.cols, data, prepared: self.prepared.get().map(|p| &**p) }
    }

    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }

    /// Rows `r..r + n` of this matrix as a matrix of its own.
    fn rows(&self, r: usize, n: usize) -> Matrix {
        Matrix { info: self.info.clone(), rows: n, cols: self.cols, row0: self.row0 + r, prepared: OnceLock::new() }
    }
}

pub struct LayerWeights {
    /// [n_embd]
    pub attn_norm: Vec<f32>,
    /// [n_head * head_dim, n_embd]
    pub wq: Matrix,
    /// [n_head_kv * head_dim, n_embd]
    pub wk: Matrix,
    /// [n_head_kv * head_dim, n_embd]
    pub wv: Matrix,
    /// [n_embd, n_head * head_dim]
    pub wo: Matrix,
    /// [n_embd]
    pub ffn_norm: Vec<f32>,
    /// [n_ff, n_embd]
    pub w_gate: Matrix,
    /// [n_ff, n_embd]
    pub w_up: Matrix,
    /// [n_embd, n_ff]
    pub w_down: Matrix,
    /// [head_dim] per-head RMSNorm weights of Q and K (`qk_norm`)
    pub q_norm: Option<Vec<f32>>,
    /// [head_dim]
    pub k_norm: Option<Vec<f32>>,
    /// [n_head * head_dim] (`qkv_bias`)
    pub bq: Option<Vec<f32>>,
    /// [n_head_kv * head_dim]
    pub bk: Option<Vec<f32>>,
    /// [n_head_kv * head_dim]
    pub bv: Option<Vec<f32>>,
    /// [n_embd] norm of the attention output before the residual add (`post_norms`)
    pub post_attn_norm: Option<Vec<f32>>,
    /// [n_embd] norm of the FFN output before the residual add (`post_norms`)
    pub post_ffn_norm: Option<Vec<f32>>,
}

pub struct Weights {
    /// [vocab, n_embd]
    pub token_embd: Matrix,
    /// [n_layer] per-layer weights
    pub layers: Vec<LayerWeights>,
    /// [n_embd]
    pub output_norm: Vec<f32>,
    /// [vocab, n_embd]; the token embedding when the output is tied
    pub output: Matrix,
    /// [rope_dims / 2] RoPE frequency divisors of the global layers (Llama 3's `rope_freqs`)
    pub rope_freqs: Option<Vec<f32>>,
}

/// Reads tensors of one file, remembering which were used.
struct Loader<'g> {
    g: &'g GgufFile,
    used: RefCell<BTreeSet<String>>,
}

impl Loader<'_> {
    fn matrix(&self, name: &str, cols: usize, rows: usize) -> Result<Matrix, GgufError> {
        let info = self.g.tensor_with_shape(name, &[cols as u64, rows as u64])?.info.clone();
        self.used.borrow_mut().insert(name.to_string());
        Ok(Matrix { info, rows, cols, row0: 0, prepared: OnceLock::new() })
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, GgufError> {
        let v = self.g.tensor_with_shape(name, &[n as u64])?.to_f32();
        self.used.borrow_mut().insert(name.to_string());
        Ok(v)
    }

    fn optional_vector(&self, name: &str, n: usize) -> Result<Option<Vec<f32>>, GgufError> {
        match self.g.tensor_info(name) {
            Ok(_) => self.vector(name, n).map(Some),
            Err(_) => Ok(None),
        }
    }
}

impl Weights {
    pub fn load(g: &GgufFile, c: &ModelConfig) -> Result<Weights, GgufError> {
        let ld = Loader { g, used: RefCell::new(BTreeSet::new()) };
        let (e, hd, qd, kvd, ff) = (c.n_embd, c.head_dim, c.q_dim(), c.kv_dim(), c.n_ff);
        let token_embd = ld.matrix("token_embd.weight", e, c.vocab_size)?;
        let layers = (0..c.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                let b = |s: &str| format!("blk.{i}.{s}.bias");
                let need = |cond: bool, name: String, len: usize| -> Result<Option<Vec<f32>>, GgufError> {
                    if cond { ld.vector(&name, len).map(Some) } else { Ok(None) }
                };
                // In file order (norm first), so the first missing tensor is the one reported.
                let attn_norm = ld.vector(&n("attn_norm"), e)?;
                let (wq, wk, wv) = if c.fused {
                    let qkv = ld.matrix(&n("attn_qkv"), e, qd + 2 * kvd)?;
                    (qkv.rows(0, qd), qkv.rows(qd, kvd), qkv.rows(qd + kvd, kvd))
                } else {
                    (ld.matrix(&n("attn_q"), e, qd)?, ld.matrix(&n("attn_k"), e, kvd)?, ld.matrix(&n("attn_v"), e, kvd)?)
                };
                let (w_gate, w_up) = if c.fused {
                    let gu = ld.matrix(&n("ffn_up"), e, 2 * ff)?;
                    (gu.rows(0, ff), gu.rows(ff, ff))
                } else {
                    (ld.matrix(&n("ffn_gate"), e, ff)?, ld.matrix(&n("ffn_up"), e, ff)?)
                };
                Ok(LayerWeights {
                    attn_norm,
                    wq,
                    wk,
                    wv,
                    wo: ld.matrix(&n("attn_output"), qd, e)?,
                    ffn_norm: ld.vector(&n("ffn_norm"), e)?,
                    w_gate,
                    w_up,
                    w_down: ld.matrix(&n("ffn_down"), ff, e)?,
                    q_norm: need(c.qk_norm, n("attn_q_norm"), hd)?,
                    k_norm: need(c.qk_norm, n("attn_k_norm"), hd)?,
                    bq: need(c.qkv_bias, b("attn_q"), qd)?,
                    bk: need(c.qkv_bias, b("attn_k"), kvd)?,
                    bv: need(c.qkv_bias, b("attn_v"), kvd)?,
                    post_attn_norm: need(c.post_norms, n("post_attention_norm"), e)?,
                    post_ffn_norm: need(c.post_norms, n("post_ffw_norm"), e)?,
                })
            })
            .collect::<Result<Vec<_>, GgufError>>()?;
        let output = if c.tied_output { token_embd.clone() } else { ld.matrix("output.weight", e, c.vocab_size)? };
        let output_norm = ld.vector("output_norm.weight", e)?;
        let rope_freqs = ld.optional_vector("rope_freqs.weight", c.rope_dims / 2)?;
        let used = ld.used.into_inner();
        if let Some(t) = g.tensors.iter().find(|t| !used.contains(&t.name)) {
            return Err(GgufError::UnexpectedTensor { name: t.name.clone(), arch: c.arch.name().to_string() });
        }
        Ok(Weights { token_embd, layers, output_norm, output, rope_freqs })
    }

    /// Asks `backend` for its own layout of the matrices of every layer `on_backend` names and
    /// of the output projection ([`Backend::prepare`]) and keeps what it makes; returns the bytes
    /// the new copies hold. A matrix prepared before is left as it is, so the kernels a matrix
    /// runs never change once it has its copy. (A tied output's copy is the output's own: the
    /// embedding lookup still reads the map.)
    pub fn prepare(&self, g: &GgufFile, backend: &dyn Backend, on_backend: impl Fn(usize) -> bool) -> usize {
        let mut bytes = 0;
        let layers = self.layers.iter().enumerate().filter(|(i, _)| on_backend(*i));
        let matrices = layers.flat_map(|(_, l)| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]);
        for m in matrices.chain([&self.output]) {
            if m.prepared.get().is_some() {
                continue;
            }
            if let Some(p) = backend.prepare(m.view(g)) {
                bytes += p.bytes;
                // A concurrent call that set it first wins: both made the same copy.
                let _ = m.prepared.set(Arc::new(p));
            }
        }
        bytes
    }
}
