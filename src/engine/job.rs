//! What the scheduler is given and gives back: a [`Job`] (a generation, or a scoring job), its
//! drafts, the [`Event`]s streamed to its submitter, and how it ended ([`Finished`], [`Scored`],
//! [`JobError`]); [`SubmitError`] when the queue refuses it; the channel for drafts that arrive
//! after the job started ([`LateSender`] / [`LateReceiver`]). The engine thread that runs jobs is
//! `engine::scheduler`.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::generate::{GenerateError, GenerateParams};
use super::prefix::PrefixCache;
use super::tokenizer::TokenizerError;
use crate::vocab::StopReason;

/// One request for the engine.
#[derive(Debug)]
pub struct Job {
    /// Token ids of the rendered prompt.
    pub prompt: Vec<u32>,
    /// max_tokens, sampling settings and stop ids of the generation.
    pub params: GenerateParams,
    /// Generation stops before the first of these strings (the text is cut there).
    pub stop_strings: Vec<String>,
    /// Where tokens and the outcome go; closing the receiver cancels the job.
    pub events: UnboundedSender<Event>,
    /// Candidate answers to check, best first (may be empty).
    pub drafts: Vec<Draft>,
    /// KV reuse: loads the stored prefix at admission, is told what the sequence computed, and
    /// comes back in [`Finished::prefix`].
    pub kv: Option<Box<dyn PrefixCache>>,
    /// Whose request this is (the tenant): slots and each step's work are shared equally
    /// between the keys of the waiting and running requests.
    pub tenant: String,
    /// Record the log-probability of every generated token (and the stop) under this prompt:
    /// [`Finished::logprobs`].
    pub logprobs: bool,
    /// Score instead of generate: the log-probability of each of these tokens given the prompt
    /// and the tokens before it, in one teacher-forced pass (no sampling, no decoding); the job
    /// ends with [`Event::Scored`]. The rows are the same bits a decode would compute (the
    /// forward pass is batch invariant).
    pub score: Option<Vec<u32>>,
    /// Drafts to come after the job started (the semantic lookup runs once the first token is
    /// chosen, off its path): from [`super::scheduler::Scheduler::late_drafts`]. The job's
    /// outcome waits for them.
    pub late: Option<LateReceiver>,
}

impl Job {
    /// A scoring job: the per-token log-probabilities of `continuation` after `prompt` (for a
    /// token of `stop_ids`: of any stop token, as generation records it).
    pub fn score(prompt: Vec<u32>, continuation: Vec<u32>, stop_ids: Vec<u32>, tenant: String, events: UnboundedSender<Event>) -> Job {
        let params = GenerateParams { max_tokens: continuation.len().max(1), sampling: Default::default(), stop_ids };
        Job { prompt, params, stop_strings: Vec::new(), events, drafts: Vec::new(), kv: None, tenant, logprobs: false, score: Some(continuation), late: None }
    }
}

/// What a scoring job found.
#[derive(Debug)]
pub struct Scored {
    /// log p(continuation[i] | prompt, continuation[..i]), natural log.
    pub logprobs: Vec<f32>,
    /// Positions the model computed.
    pub computed: usize,
    /// Submit to admission, and admission to the end.
    pub queue_time: Duration,
    /// Admission to the end.
    pub run_time: Duration,
    /// Prompt positions whose KV was loaded from the job's prefix cache instead of computed.
    pub kv_reused: usize,
    /// The job's prefix cache, back by value (it has seen the prompt's KV: a generation for the
    /// same prompt that follows can load all of it).
    pub prefix: Option<Box<dyn PrefixCache>>,
}

/// A candidate answer: the tokens the model is expected to generate, ending with a stop token
/// when the answer ended with one.
#[derive(Debug, Clone)]
pub struct Draft {
    /// Token ids of the answer.
    pub tokens: Vec<u32>,
    /// Where it came from (the caller's id, e.g. an inference row).
    pub source: i64,
    /// Cosine similarity of the neighbour's question to this job's (semantic cache).
    pub similarity: f64,
}

#[derive(Debug)]
pub enum Event {
    /// A generated token and the text that became final with it (may be empty: half a UTF-8
    /// character, or text that could be the start of a stop string, is held back).
    Token { id: u32, text: String },
    Done(Finished),
    /// The end of a scoring job.
    Scored(Scored),
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

#[derive(Debug)]
pub struct Finished {
    /// Length of the prompt in tokens.
    pub prompt_tokens: usize,
    /// Generated ids, without the stop token.
    pub tokens: Vec<u32>,
    /// The whole text (special tokens skipped), cut before a stop string. The `Token` events
    /// carried a prefix of it; the rest (held back, or an unfinished character) is not sent.
    pub text: String,
    /// Why generation ended.
    pub stop: StopReason,
    /// Submit to admission.
    pub queue_time: Duration,
    /// Admission to the first token.
    pub prefill_time: Duration,
    /// First token to the end.
    pub decode_time: Duration,
    /// Forward calls that fed tokens after the prompt.
    pub decode_steps: usize,
    /// The most sequences that shared one forward call with this one (1 = alone).
    pub peak_batch: usize,
    /// Positions the model computed (prompt, decode steps, checked draft tokens, rejected ones).
    pub computed: usize,
    /// Draft tokens fed for checking, and those the model agreed with.
    pub draft_tokens: usize,
    /// Draft tokens the model agreed with.
    pub draft_accepted: usize,
    /// Candidates whose tokens were fed.
    pub candidates_tried: usize,
    /// The draft that was accepted at every generated token (and the stop), if one was.
    pub served_by: Option<Draft>,
    /// The draft last in use when some but not all tokens came from drafts.
    pub partial_source: Option<Draft>,
    /// Prompt positions whose KV was loaded from stored blocks instead of computed.
    pub kv_reused: usize,
    /// With [`Job::logprobs`]: the natural-log probability of each generated token under the
    /// model's raw distribution, then of any stop token when the answer ended on one.
    pub logprobs: Vec<f32>,
    /// The job's prefix cache, back by value (it has seen everything the sequence computed).
    pub prefix: Option<Box<dyn PrefixCache>>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SubmitError {
    #[error("the request queue is full ({0} requests waiting); try again later")]
    QueueFull(usize),
    #[error("the engine has stopped")]
    Stopped,
}

// Drafts that arrive after the job started: the channel between the submitter's lookup and the
// engine (attaching them is `scheduler::late`).


#[derive(Debug)]
enum State {
    /// No token chosen yet.
    Waiting,
    /// The first token is chosen: the submitter may look for drafts.
    FirstChosen,
    Delivered(Vec<Draft>),
    /// The engine took the drafts.
    Taken,
    /// The job left the engine before taking drafts.
    Gone,
}

#[derive(Debug)]
struct Slot {
    state: Mutex<State>,
    changed: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

/// The engine's end, carried by [`Job::late`].
#[derive(Debug)]
pub struct LateReceiver {
    slot: Arc<Slot>,
}

/// The submitter's end. Dropped without [`LateSender::send`], it delivers no drafts (the job
/// never waits for it in vain).
pub struct LateSender {
    slot: Arc<Slot>,
    /// wakes the engine thread (the scheduler's queue signal)
    wake: Arc<dyn Fn() + Send + Sync>,
    sent: bool,
}

/// After [`LateSender::send`]: whether the engine took the drafts.
pub struct LateTicket {
    slot: Arc<Slot>,
}

/// A new channel; `wake` tells the engine thread that drafts arrived.
pub(super) fn late_pair(wake: Arc<dyn Fn() + Send + Sync>) -> (LateSender, LateReceiver) {
    let slot = Arc::new(Slot { state: Mutex::new(State::Waiting), changed: Condvar::new() });
    (LateSender { slot: slot.clone(), wake, sent: false }, LateReceiver { slot })
}

impl LateSender {
    /// Blocks until the job's first token is chosen (`true`) or the job left the engine first
    /// (`false`: nothing to attach drafts to).
    pub fn wait_first(&self) -> bool {
        let mut s = self.slot.lock();
        loop {
            match *s {
                State::Waiting => s = self.slot.changed.wait(s).unwrap_or_else(|e| e.into_inner()),
                State::FirstChosen => return true,
                _ => return false,
            }
        }
    }

    /// Hands the drafts (best first; may be empty) to the job and wakes the engine.
    pub fn send(mut self, drafts: Vec<Draft>) -> LateTicket {
        self.deliver(drafts);
        LateTicket { slot: self.slot.clone() }
    }

    fn deliver(&mut self, drafts: Vec<Draft>) {
        self.sent = true;
        self.slot.set(|s| {
            if matches!(s, State::Waiting | State::FirstChosen) {
                *s = State::Delivered(drafts);
            }
        });
        (self.wake)();
    }
}

impl Drop for LateSender {
    fn drop(&mut self) {
        if !self.sent {
            self.deliver(Vec::new());
        }
    }
}

impl LateTicket {
    /// The engine attached the drafts before the job ended.
    pub fn taken(&self) -> bool {
        matches!(*self.slot.lock(), State::Taken)
    }
}

impl LateReceiver {
    pub(super) fn first_chosen(&self) {
        self.slot.set(|s| {
            if matches!(s, State::Waiting) {
                *s = State::FirstChosen;
            }
        });
    }

    /// The drafts, once delivered (then `Taken`).
    pub(super) fn take(&self) -> Option<Vec<Draft>> {
        let mut s = self.slot.lock();
        if !matches!(*s, State::Delivered(_)) {
            return None;
        }
        match std::mem::replace(&mut *s, State::Taken) {
            State::Delivered(d) => Some(d),
            _ => None,
        }
    }

    /// The drafts are there (a parked sequence may finish).
    pub(super) fn ready(&self) -> bool {
        matches!(*self.slot.lock(), State::Delivered(_))
    }
}

impl Drop for LateReceiver {
    fn drop(&mut self) {
        self.slot.set(|s| {
            if !matches!(s, State::Taken) {
                *s = State::Gone;
            }
        });
    }
}
