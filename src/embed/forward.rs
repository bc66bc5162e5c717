//! The BERT encoder forward pass on [`Backend`] kernels, a bidirectional f32 attention helper,
//! and mean pooling + L2 normalization.
//!
//! Several sequences run as one batch of tokens: every kernel but attention works per token
//! (matmul computes each (row, token) dot product the same way whatever the batch), and
//! attention only looks at keys of the query's own sequence, so a text's embedding does not
//! depend on what else is in the batch (bitwise; tested in `tests.rs`).

use super::config::BertConfig;
use super::weights::{Linear, Weights};
use crate::backend::Backend;

/// Activation buffers for up to `cap` tokens, allocated once per call and reused by every layer.
pub struct Buffers {
    cap: usize,
    /// [cap, hidden] hidden states
    h: Vec<f32>,
    /// [cap, hidden]
    q: Vec<f32>,
    /// [cap, hidden]
    k: Vec<f32>,
    /// [cap, hidden]
    v: Vec<f32>,
    /// [cap, hidden] attention output (heads concatenated)
    ctx: Vec<f32>,
    /// [cap, hidden] pre-LayerNorm sums
    tmp: Vec<f32>,
    /// [cap, intermediate]
    ff: Vec<f32>,
    /// [max_seq] attention scores of one query
    scores: Vec<f32>,
    /// [max_seq, head_dim] one head's keys, gathered
    kh: Vec<f32>,
    /// [max_seq, head_dim] one head's values, gathered
    vh: Vec<f32>,
}

impl Buffers {
    /// Buffers for batches of at most `cap` tokens, no sequence longer than `max_seq`.
    pub fn new(cfg: &BertConfig, cap: usize, max_seq: usize) -> Buffers {
        let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
        let z = |n: usize| vec![0f32; n];
        Buffers {
            cap,
            h: z(cap * h),
            q: z(cap * h),
            k: z(cap * h),
            v: z(cap * h),
            ctx: z(cap * h),
            tmp: z(cap * h),
            ff: z(cap * i),
            scores: z(max_seq),
            kh: z(max_seq * hd),
            vh: z(max_seq * hd),
        }
    }
}

/// `out = W x + b` for `n_tok` tokens. x: [n_tok, cols], out: [n_tok, rows]
fn linear(backend: &dyn Backend, map: (&[u8], &[u8]), l: &Linear, x: &[f32], n_tok: usize, out: &mut [f32]) {
    backend.matmul(l.view(map.0, map.1), x, n_tok, out);
    for row in out.chunks_exact_mut(l.rows) {
        for (o, b) in row.iter_mut().zip(&l.b) {
            *o += b;
        }
    }
}

/// Runs the encoder on `seqs` (token ids already checked against the vocabulary and the
/// position table; total length at most the buffers' capacity) and returns one mean-pooled,
/// L2-normalized vector per sequence.
pub fn encode(
    backend: &dyn Backend,
    map: &[u8],
    w: &Weights,
    cfg: &BertConfig,
    seqs: &[&[u32]],
    buf: &mut Buffers,
) -> Vec<Vec<f32>> {
    let hs = cfg.hidden_size;
    let t: usize = seqs.iter().map(|s| s.len()).sum();
    assert!(t <= buf.cap, "batch of {t} tokens exceeds buffers of {}", buf.cap);
    let eps = cfg.layer_norm_eps as f32;
    let (x, tmp) = (&mut buf.h[..t * hs], &mut buf.tmp[..t * hs]);

    // Embeddings: word + position + token type 0, then LayerNorm.
    let mut rows = tmp.chunks_exact_mut(hs);
    for s in seqs {
        for (pos, (&id, row)) in s.iter().zip(rows.by_ref()).enumerate() {
            row.copy_from_slice(&w.token_type0);
            w.word.add_row(map, id as usize, hs, row);
            w.position.add_row(map, pos, hs, row);
        }
    }
    backend.layernorm(tmp, &w.emb_norm.w, &w.emb_norm.b, eps, x);

    let (q, k, v, ctx) = (&mut buf.q[..t * hs], &mut buf.k[..t * hs], &mut buf.v[..t * hs], &mut buf.ctx[..t * hs]);
    let ff = &mut buf.ff[..t * cfg.intermediate_size];
    let mats = (map, w.half_bytes());
    for layer in &w.layers {
        linear(backend, mats, &layer.query, x, t, q);
        linear(backend, mats, &layer.key, x, t, k);
        linear(backend, mats, &layer.value, x, t, v);
        let mut start = 0;
        for s in seqs {
            let r = start * hs..(start + s.len()) * hs;
            let scratch = AttnScratch { scores: &mut buf.scores, kh: &mut buf.kh, vh: &mut buf.vh };
            attention(
                &q[r.clone()],
                &k[r.clone()],
                &v[r.clone()],
                cfg.num_attention_heads,
                cfg.head_dim(),
                scratch,
                &mut ctx[r],
            );
            start += s.len();
        }
        linear(backend, mats, &layer.attn_out, ctx, t, tmp);
        backend.add(tmp, x);
        backend.layernorm(tmp, &layer.attn_norm.w, &layer.attn_norm.b, eps, x);

        linear(backend, mats, &layer.ffn_up, x, t, ff);
        backend.gelu(ff);
        linear(backend, mats, &layer.ffn_down, ff, t, tmp);
        backend.add(tmp, x);
        backend.layernorm(tmp, &layer.ffn_norm.w, &layer.ffn_norm.b, eps, x);
    }

    let mut start = 0;
    seqs.iter()
        .map(|s| {
            let v = mean_pool_normalize(&x[start * hs..(start + s.len()) * hs], hs);
            start += s.len();
            v
        })
        .collect()
}

/// Mean over the rows of `x` ([n, dim], real tokens only), then L2 normalization
/// (`v / max(|v|, 1e-12)`, as `torch.nn.functional.normalize`). Sums in f64.
pub fn mean_pool_normalize(x: &[f32], dim: usize) -> Vec<f32> {
    let n = x.len() / dim.max(1);
    let mut acc = vec![0f64; dim];
    for row in x.chunks_exact(dim) {
        for (a, v) in acc.iter_mut().zip(row) {
            *a += *v as f64;
        }
    }
    let inv_n = 1.0 / n.max(1) as f64;
    acc.iter_mut().for_each(|a| *a *= inv_n);
    let norm = acc.iter().map(|a| a * a).sum::<f64>().sqrt().max(1e-12);
    acc.iter().map(|a| (a / norm) as f32).collect()
}

/// Scratch for [`attention`], sized for the longest sequence.
pub struct AttnScratch<'a> {
    /// [>= n]
    pub scores: &'a mut [f32],
    /// [>= n, head_dim]
    pub kh: &'a mut [f32],
    /// [>= n, head_dim]
    pub vh: &'a mut [f32],
}

/// Dot product with 8 independent accumulators (vectorizes; fixed order).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + tail
}

/// Bidirectional multi-head self-attention of one sequence, in f32: every token attends to
/// every token of the same sequence (no mask: there is no padding in it). Scores are scaled by
/// 1/sqrt(head_dim) and soft-maxed in f32 after subtracting their maximum.
/// q, k, v, out: [n, n_head * head_dim], heads side by side (BERT's layout).
pub fn attention(q: &[f32], k: &[f32], v: &[f32], n_head: usize, head_dim: usize, s: AttnScratch<'_>, out: &mut [f32]) {
    let hidden = n_head * head_dim;
    let n = q.len() / hidden.max(1);
    assert!(
        k.len() == n * hidden && v.len() == n * hidden && out.len() == n * hidden,
        "attention: q/k/v/out not [n, hidden]"
    );
    let (scores, kh, vh) = (&mut s.scores[..n], &mut s.kh[..n * head_dim], &mut s.vh[..n * head_dim]);
    let scale = 1.0 / (head_dim as f32).sqrt();
    for h in 0..n_head {
        let cols = h * head_dim..(h + 1) * head_dim;
        // Gather this head's keys and values into contiguous [n, head_dim] rows.
        for j in 0..n {
            let src = j * hidden + cols.start..j * hidden + cols.end;
            kh[j * head_dim..(j + 1) * head_dim].copy_from_slice(&k[src.clone()]);
            vh[j * head_dim..(j + 1) * head_dim].copy_from_slice(&v[src]);
        }
        for i in 0..n {
            let qi = &q[i * hidden + cols.start..i * hidden + cols.end];
            let mut m = f32::NEG_INFINITY;
            for (sc, kj) in scores.iter_mut().zip(kh.chunks_exact(head_dim)) {
                *sc = dot(qi, kj) * scale;
                m = m.max(*sc);
            }
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - m).exp();
                sum += *sc;
            }
            let o = &mut out[i * hidden + cols.start..i * hidden + cols.end];
            o.fill(0.0);
            for (&p, vj) in scores.iter().zip(vh.chunks_exact(head_dim)) {
                for (oo, vv) in o.iter_mut().zip(vj) {
                    *oo += p * vv;
                }
            }
            let inv = 1.0 / sum;
            o.iter_mut().for_each(|x| *x *= inv);
        }
    }
}
