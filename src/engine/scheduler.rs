//! Continuous batching. One dedicated thread (not an async worker: the CPU backend has its own
//! thread pool) owns a [`RunState`] and runs the model for every request, fed by a bounded
//! queue. Each step it
//!
//! 1. admits waiting requests while fewer than `max_active` sequences run (a full queue refuses
//!    new requests at once: [`SubmitError::QueueFull`]);
//! 2. drops sequences whose client went away (their event channel closed);
//! 3. makes ONE forward call holding the next token of every decoding sequence plus prompt
//!    chunks of prefilling ones, within `step_tokens` tokens, so a long prompt is spread over
//!    several steps instead of stalling everyone's decoding;
//! 4. samples each sequence's next token on the CPU and streams it back through that request's
//!    channel; finished sequences leave.
//!
//! The forward pass is bitwise batch invariant (see `docs/architecture.md`), so a greedy
//! request produces the same tokens alone, in any company, and with any prefill chunking —
//! the same tokens as [`super::generate::generate`]: the same sampling and stop checks in the
//! same order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;

use super::generate::{GenerateError, GenerateParams, StopReason};
use super::model::{Logits, Model, RunState, SeqBatch};
use super::sampler::Sampler;
use super::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use super::KvCache;
use crate::workload::KvPlan;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Requests that may wait for a slot; one more is refused at once.
    pub queue_depth: usize,
    /// Sequences generating at the same time.
    pub max_active: usize,
    /// Tokens per forward call (decode tokens first, then prompt chunks); at least `max_active`.
    pub step_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { queue_depth: 64, max_active: 8, step_tokens: 64 }
    }
}

/// One request for the engine.
#[derive(Debug)]
pub struct Job {
    /// Token ids of the rendered prompt.
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Generation stops before the first of these strings (the text is cut there).
    pub stop_strings: Vec<String>,
    /// Where tokens and the outcome go; closing the receiver cancels the job.
    pub events: UnboundedSender<Event>,
    /// KV reuse: the stored prefix to load at admission, where computed blocks are published.
    pub kv: Option<KvPlan>,
}

#[derive(Debug)]
pub enum Event {
    /// A generated token and the text that became final with it (may be empty: half a UTF-8
    /// character, or text that could be the start of a stop string, is held back).
    Token { id: u32, text: String },
    Done(Finished),
    Failed(JobError),
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("the forward pass failed: {0}")]
    Forward(String),
}

#[derive(Debug, Clone)]
pub struct Finished {
    pub prompt_tokens: usize,
    /// Generated ids, without the stop token.
    pub tokens: Vec<u32>,
    /// The whole text (special tokens skipped), cut before a stop string. The `Token` events
    /// carried a prefix of it; the rest (held back, or an unfinished character) is not sent.
    pub text: String,
    pub stop: StopReason,
    /// Submit to admission.
    pub queue_time: Duration,
    /// Admission to the first token.
    pub prefill_time: Duration,
    /// First token to the end.
    pub decode_time: Duration,
    pub decode_steps: usize,
    /// The most sequences that shared one forward call with this one (1 = alone).
    pub peak_batch: usize,
    /// Prompt positions whose KV was loaded from stored blocks instead of computed.
    pub kv_reused: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("the request queue is full ({0} requests waiting); try again later")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}

struct Queued {
    job: Job,
    at: Instant,
}

/// Handle to the engine thread. Dropping it stops the thread (running requests are cancelled).
pub struct Scheduler {
    tx: Option<SyncSender<Queued>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    config: SchedulerConfig,
}

impl Scheduler {
    /// Starts the engine thread; `model` and `tokenizer` are used only there.
    pub fn start(model: Arc<Model>, tokenizer: Arc<Tokenizer>, config: SchedulerConfig) -> std::io::Result<Scheduler> {
        let config = SchedulerConfig {
            queue_depth: config.queue_depth.max(1),
            max_active: config.max_active.max(1),
            step_tokens: config.step_tokens.max(config.max_active.max(1)),
        };
        let (tx, rx) = mpsc::sync_channel(config.queue_depth);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("forge-engine".into())
            .spawn(move || Engine { model: &model, tok: &tokenizer, config, stop: &flag }.run(rx))?;
        Ok(Scheduler { tx: Some(tx), stop, thread: Some(thread), config })
    }

    /// Queues a job, or refuses it at once when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let tx = self.tx.as_ref().ok_or(SubmitError::Stopped)?;
        match tx.try_send(Queued { job, at: Instant::now() }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::QueueFull(self.config.queue_depth)),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Stopped),
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running sequence.
struct Seq {
    job: Job,
    kv: KvCache,
    sampler: Sampler,
    /// Prompt tokens already fed.
    fed: usize,
    /// The token the next decode step feeds.
    next: [u32; 1],
    tokens: Vec<u32>,
    decoder: StreamDecoder,
    text: String,
    /// Bytes of `text` already sent.
    sent: usize,
    /// `text` was cut at a stop string.
    cut: bool,
    queued_at: Instant,
    admitted_at: Instant,
    first_token_at: Option<Instant>,
    decode_steps: usize,
    peak_batch: usize,
    /// Tokens this step feeds.
    part: usize,
    /// Prompt positions loaded from stored KV blocks.
    kv_reused: usize,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.fed < self.job.prompt.len()
    }

    fn send(&self, e: Event) -> bool {
        self.job.events.send(e).is_ok()
    }
}

struct Engine<'a> {
    model: &'a Model,
    tok: &'a Tokenizer,
    config: SchedulerConfig,
    stop: &'a AtomicBool,
}

/// What happened to a sequence after a token.
enum Next {
    Continue,
    Finish(StopReason),
    Gone,
}

impl Engine<'_> {
    fn run(self, rx: Receiver<Queued>) {
        let mut state: RunState = self.model.new_state(self.config.step_tokens);
        let mut active: Vec<Seq> = Vec::new();
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if active.is_empty() {
                match rx.recv() {
                    Ok(q) => self.admit(q, &mut active),
                    Err(_) => return,
                }
            }
            while active.len() < self.config.max_active {
                match rx.try_recv() {
                    Ok(q) => self.admit(q, &mut active),
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            }
            active.retain(|s| !s.job.events.is_closed());
            if !active.is_empty() {
                self.step(&mut state, &mut active);
            }
        }
    }

    fn admit(&self, q: Queued, active: &mut Vec<Seq>) {
        let mut job = q.job;
        let context = self.model.config.n_ctx_train;
        let fail = |e: GenerateError| {
            let _ = job.events.send(Event::Failed(e.into()));
        };
        if job.prompt.is_empty() {
            return fail(GenerateError::EmptyPrompt);
        }
        if job.prompt.len() >= context {
            return fail(GenerateError::PromptTooLong { prompt: job.prompt.len(), context });
        }
        let sampler = match Sampler::new(job.params.sampling, self.model.config.vocab_size) {
            Ok(s) => s,
            Err(e) => return fail(GenerateError::Sampling(e)),
        };
        let mut kv = self.model.new_kv(job.prompt.len() + job.params.max_tokens);
        let kv_reused = job.kv.as_mut().map_or(0, |p| p.load(&mut kv, &job.prompt));
        active.push(Seq {
            job,
            kv,
            sampler,
            fed: kv_reused,
            next: [0],
            tokens: Vec::new(),
            decoder: StreamDecoder::new(true),
            text: String::new(),
            sent: 0,
            cut: false,
            queued_at: q.at,
            admitted_at: Instant::now(),
            first_token_at: None,
            decode_steps: 0,
            peak_batch: 0,
            part: 0,
            kv_reused,
        });
    }

    /// One forward call over every active sequence, then sampling.
    fn step(&self, state: &mut RunState, active: &mut Vec<Seq>) {
        // Decode tokens first (one each; step_tokens >= max_active), prompt chunks after, oldest first.
        let mut budget = self.config.step_tokens;
        for s in active.iter_mut() {
            s.part = usize::from(!s.prefilling());
            budget -= s.part;
        }
        for s in active.iter_mut().filter(|s| s.prefilling()) {
            s.part = (s.job.prompt.len() - s.fed).min(budget);
            budget -= s.part;
        }
        let n_seqs = active.iter().filter(|s| s.part > 0).count();
        let mut batch: Vec<SeqBatch<'_>> = active
            .iter_mut()
            .filter(|s| s.part > 0)
            .map(|s| {
                let (tokens, logits) = if s.prefilling() {
                    let end = s.fed + s.part;
                    let last = if end == s.job.prompt.len() { Logits::Last } else { Logits::None };
                    (&s.job.prompt[s.fed..end], last)
                } else {
                    (&s.next[..], Logits::Last)
                };
                SeqBatch { kv: &mut s.kv, tokens, logits }
            })
            .collect();
        let result = self.model.forward(state, &mut batch);
        drop(batch);
        if let Err(e) = result {
            // Cannot happen for validated jobs; fail those in the call and keep serving the rest.
            let msg = e.to_string();
            active.retain(|s| {
                if s.part > 0 {
                    let _ = s.send(Event::Failed(JobError::Forward(msg.clone())));
                }
                s.part == 0
            });
            return;
        }

        let mut row = 0;
        let mut finished: Vec<(usize, Option<StopReason>)> = Vec::new();
        for (i, s) in active.iter_mut().enumerate().filter(|(_, s)| s.part > 0) {
            s.peak_batch = s.peak_batch.max(n_seqs);
            if s.prefilling() {
                s.fed += s.part;
                if s.prefilling() {
                    continue; // more prompt to feed; this chunk asked for no logits
                }
                s.first_token_at = Some(Instant::now());
                if let Some(p) = s.job.kv.as_mut() {
                    p.publish(&s.kv, &s.job.prompt, &[]);
                }
            } else {
                s.decode_steps += 1;
            }
            let next = s.sampler.sample(self.model.logits(state, row));
            row += 1;
            match self.on_token(s, next) {
                Next::Continue => {}
                Next::Finish(reason) => finished.push((i, Some(reason))),
                Next::Gone => finished.push((i, None)),
            }
        }
        for &(i, reason) in finished.iter().rev() {
            let s = active.remove(i);
            if let Some(reason) = reason {
                self.finish(s, reason);
            }
        }
    }

    /// Applies a sampled token: stop checks in `generate`'s order, streaming, stop strings.
    fn on_token(&self, s: &mut Seq, id: u32) -> Next {
        if s.job.params.stop_ids.contains(&id) {
            return Next::Finish(StopReason::Stop);
        }
        s.tokens.push(id);
        match s.decoder.push(self.tok, id) {
            Ok(piece) => s.text.push_str(&piece),
            Err(e) => {
                let _ = s.send(Event::Failed(e.into()));
                return Next::Gone;
            }
        }
        // Text before `sent` holds no beginning of a stop string (it was held back), so a match starts at or after it.
        if let Some(at) = find_stop(&s.text[s.sent..], &s.job.stop_strings) {
            s.text.truncate(s.sent + at);
            s.cut = true;
            return Next::Finish(StopReason::Stop);
        }
        let safe = (s.text.len() - held_back(&s.text, &s.job.stop_strings)).max(s.sent);
        let text = s.text[s.sent..safe].to_string();
        s.sent = safe;
        if !s.send(Event::Token { id, text }) {
            return Next::Gone;
        }
        if s.tokens.len() >= s.job.params.max_tokens {
            return Next::Finish(StopReason::Length);
        }
        if s.kv.len() >= s.kv.capacity {
            return Next::Finish(StopReason::ContextFull);
        }
        s.next = [id];
        Next::Continue
    }

    fn finish(&self, mut s: Seq, stop: StopReason) {
        if !s.cut {
            // An unfinished character at the end becomes U+FFFD.
            s.text.push_str(&s.decoder.finish());
        }
        if let Some(p) = s.job.kv.as_mut() {
            p.publish(&s.kv, &s.job.prompt, &s.tokens);
        }
        let now = Instant::now();
        let first = s.first_token_at.unwrap_or(now);
        let done = Finished {
            prompt_tokens: s.job.prompt.len(),
            tokens: std::mem::take(&mut s.tokens),
            text: std::mem::take(&mut s.text),
            stop,
            queue_time: s.admitted_at.duration_since(s.queued_at),
            prefill_time: first.duration_since(s.admitted_at),
            decode_time: now.duration_since(first),
            decode_steps: s.decode_steps,
            peak_batch: s.peak_batch,
            kv_reused: s.kv_reused,
        };
        let _ = s.send(Event::Done(done));
    }
}

/// Byte offset of the earliest stop string in `text`.
fn find_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min()
}

/// Length of the longest end of `text` that could still grow into a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|s| (1..s.len()).rev().filter(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k])).take(1))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_helpers() {
        let stops = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(find_stop("abc END x\n\n", &stops), Some(4));
        assert_eq!(find_stop("abc", &stops), None);
        assert_eq!(held_back("abc E", &stops), 1);
        assert_eq!(held_back("abc EN", &stops), 2);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(held_back("é", &["éa".to_string()]), 2);
    }
}
