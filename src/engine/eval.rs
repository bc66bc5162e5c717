//! Model quality measurements: perplexity by llama.cpp's method, so numbers compare directly.

use super::model::{Logits, Model, ModelError, RunState};

#[derive(Debug, Clone, serde::Serialize)]
pub struct Perplexity {
    /// Perplexity: exp(nll).
    pub ppl: f64,
    /// Chunks of n_ctx tokens evaluated (a partial last chunk is dropped).
    pub n_chunks: usize,
    /// Tokens scored (those in the second half of each chunk, as llama.cpp).
    pub scored_tokens: usize,
    /// Mean negative log-likelihood per scored token.
    pub nll: f64,
}

/// llama.cpp's perplexity: split `tokens` into chunks of `n_ctx` (the remainder dropped), run each
/// chunk from an empty KV cache, score the second half of each chunk (logits at positions
/// n_ctx/2 .. n_ctx-2 predict the next token). With `bos` (a model that adds BOS), the first
/// token of every chunk is replaced by it, as llama.cpp does. `progress(done, total)` is called
/// per chunk.
pub fn perplexity(
    model: &Model,
    state: &mut RunState,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    mut progress: impl FnMut(usize, usize),
) -> Result<Perplexity, ModelError> {
    let n_chunks = tokens.len() / n_ctx;
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut chunk = vec![0u32; n_ctx];
    for c in 0..n_chunks {
        chunk.copy_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let mut kv = model.new_kv(n_ctx);
        // Feed in pieces that fit the run state; score the logits of each piece right away (only
        // the rows that are scored are computed).
        let mut start = 0;
        while start < n_ctx {
            let end = (start + state.max_tokens).min(n_ctx);
            let from = first.max(start);
            let want = if end > from { Logits::From(from - start) } else { Logits::None };
            model.forward(state, &mut [super::SeqBatch { kv: &mut kv, tokens: &chunk[start..end], logits: want }])?;
            if want != Logits::None {
                for pos in from..end.min(n_ctx - 1) {
                    let logits = model.logits(state, pos - from);
                    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let z: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
                    nll += -(logits[chunk[pos + 1] as usize] as f64 - max - z.ln());
                    count += 1;
                }
            }
            start = end;
        }
        progress(c + 1, n_chunks);
    }
    let mean = nll / count.max(1) as f64;
    Ok(Perplexity { ppl: mean.exp(), n_chunks, scored_tokens: count, nll: mean })
}
