//! The generation loop on token ids: batched prefill of the prompt (in chunks of the run
//! state's size), then one-token decode steps until a stop token, the token budget, or the
//! caller says stop. Timing of both phases is measured here so every front end reports the same.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::model::{Logits, Model, ModelError, RunState, SeqBatch};
use super::sampler::{Sampler, SamplingError, SamplingParams};
use super::KvCache;

#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How each token is sampled.
    pub sampling: SamplingParams,
    /// Tokens that end generation (not included in the output).
    pub stop_ids: Vec<u32>,
}

/// The shared vocabulary's stop reason ([`crate::vocab`]), re-exported for the engine's callers.
pub use crate::vocab::StopReason;

#[derive(Debug, Clone)]
pub struct Generation {
    /// Length of the prompt in tokens.
    pub prompt_tokens: usize,
    /// Generated ids, without the stop token.
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub stop: StopReason,
    /// The stop token that ended generation (for `StopReason::Stop`).
    pub stop_token: Option<u32>,
    /// Time of the prompt's prefill.
    pub prefill_time: Duration,
    /// Time of the decode steps (each step: one forward of one token plus sampling).
    pub decode_time: Duration,
    /// Decode steps run (forwards of one token; can be one fewer than `tokens`).
    pub decode_steps: usize,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    pub fn decode_tok_s(&self) -> f64 {
        if self.decode_steps == 0 {
            return 0.0;
        }
        self.decode_steps as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens; the model's context is {context}")]
    PromptTooLong { prompt: usize, context: usize },
}

/// Feeds `tokens` to the sequence in chunks that fit the run state; the last chunk's logits
/// (per `last`) are left in `state`.
pub fn prefill(model: &Model, state: &mut RunState, kv: &mut KvCache, tokens: &[u32], last: Logits) -> Result<(), ModelError> {
    let chunks: Vec<&[u32]> = tokens.chunks(state.max_tokens).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let logits = if i + 1 == chunks.len() { last } else { Logits::None };
        model.forward(state, &mut [SeqBatch { kv: &mut *kv, tokens: chunk, logits }])?;
    }
    Ok(())
}

/// Generates from `prompt`. `on_token` sees each new token id as it is produced and may
/// return `ControlFlow::Break(())` to stop (e.g. the client disconnected).
pub fn generate(
    model: &Model,
    state: &mut RunState,
    prompt: &[u32],
    params: &GenerateParams,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let context = model.config.n_ctx_train;
    if prompt.len() >= context {
        return Err(GenerateError::PromptTooLong { prompt: prompt.len(), context });
    }
    let mut sampler = Sampler::new(params.sampling, model.config.vocab_size)?;
    let mut kv = model.new_kv(prompt.len() + params.max_tokens);

    let t0 = Instant::now();
    prefill(model, state, &mut kv, prompt, Logits::Last)?;
    let prefill_time = t0.elapsed();

    let t1 = Instant::now();
    let mut tokens = Vec::with_capacity(params.max_tokens);
    let mut steps = 0;
    let mut stop_token = None;
    let stop = loop {
        if tokens.len() >= params.max_tokens {
            break StopReason::Length;
        }
        let next = sampler.sample(model.logits(state, 0));
        if params.stop_ids.contains(&next) {
            stop_token = Some(next);
            break StopReason::Stop;
        }
        tokens.push(next);
        if on_token(next).is_break() {
            break StopReason::Cancelled;
        }
        if tokens.len() >= params.max_tokens {
            break StopReason::Length;
        }
        if kv.len() >= kv.capacity {
            break StopReason::ContextFull;
        }
        model.forward(state, &mut [SeqBatch { kv: &mut kv, tokens: &[next], logits: Logits::Last }])?;
        steps += 1;
    };
    Ok(Generation {
        prompt_tokens: prompt.len(),
        tokens,
        stop,
        stop_token,
        prefill_time,
        decode_time: t1.elapsed(),
        decode_steps: steps,
    })
}
