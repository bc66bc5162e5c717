//! Model weights: read-only views into the GGUF memory map, located and shape-checked once at
//! load. Matrices are never copied; only the tiny norm vectors are dequantized to f32.

use crate::backend::WeightView;
use crate::gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

use super::config::LlamaConfig;

/// A weight matrix in the map: `rows` outputs × `cols` inputs (GGML dims [cols, rows]).
#[derive(Debug, Clone)]
pub struct Matrix {
    pub info: TensorInfo,
    pub rows: usize,
    pub cols: usize,
}

impl Matrix {
    fn load(g: &GgufFile, name: &str, cols: usize, rows: usize) -> Result<Matrix, GgufError> {
        let info = g.tensor_with_shape(name, &[cols as u64, rows as u64])?.info.clone();
        Ok(Matrix { info, rows, cols })
    }

    pub fn view<'a>(&self, g: &'a GgufFile) -> WeightView<'a> {
        WeightView { ty: self.info.ty, rows: self.rows, cols: self.cols, data: g.data(&self.info) }
    }

    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }
}

fn vector(g: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, GgufError> {
    Ok(g.tensor_with_shape(name, &[n as u64])?.to_f32())
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
}

pub struct Weights {
    /// [vocab, n_embd]
    pub token_embd: Matrix,
    pub layers: Vec<LayerWeights>,
    /// [n_embd]
    pub output_norm: Vec<f32>,
    /// [vocab, n_embd]; the token embedding when the output is tied
    pub output: Matrix,
}

impl Weights {
    pub fn load(g: &GgufFile, c: &LlamaConfig) -> Result<Weights, GgufError> {
        let (e, qd, kvd) = (c.n_embd, c.n_head * c.head_dim, c.kv_dim());
        let token_embd = Matrix::load(g, "token_embd.weight", e, c.vocab_size)?;
        let layers = (0..c.n_layer)
            .map(|i| {
                let n = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(LayerWeights {
                    attn_norm: vector(g, &n("attn_norm"), e)?,
                    wq: Matrix::load(g, &n("attn_q"), e, qd)?,
                    wk: Matrix::load(g, &n("attn_k"), e, kvd)?,
                    wv: Matrix::load(g, &n("attn_v"), e, kvd)?,
                    wo: Matrix::load(g, &n("attn_output"), qd, e)?,
                    ffn_norm: vector(g, &n("ffn_norm"), e)?,
                    w_gate: Matrix::load(g, &n("ffn_gate"), e, c.n_ff)?,
                    w_up: Matrix::load(g, &n("ffn_up"), e, c.n_ff)?,
                    w_down: Matrix::load(g, &n("ffn_down"), c.n_ff, e)?,
                })
            })
            .collect::<Result<Vec<_>, GgufError>>()?;
        let output = if c.tied_output {
            token_embd.clone()
        } else {
            Matrix::load(g, "output.weight", e, c.vocab_size)?
        };
        Ok(Weights { token_embd, layers, output_norm: vector(g, "output_norm.weight", e)?, output })
    }
}
