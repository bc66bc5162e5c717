//! Continuous batching. One dedicated thread (not an async worker: the CPU backend has its own
//! thread pool) owns a [`RunState`] and runs the model for every request, fed by a bounded
//! queue. Each step it
//!
//! 1. admits waiting requests while fewer than `max_active` sequences run, the tenant with the
//!    fewest running sequences first, and never gives one tenant the last free slot
//!    ([`fair::pick`]; a full queue refuses new requests at once: [`SubmitError::QueueFull`]);
//! 2. drops sequences whose client went away (their event channel closed);
//! 3. makes ONE forward call holding the next token of every decoding sequence plus prompt
//!    chunks of prefilling ones, within a budget that keeps a step near `step_time` however
//!    deep into a long prompt it is, shared equally between tenants and, within a tenant,
//!    shortest prompt first ([`fair::split`]): a short request is prefilled in the step after
//!    it arrives, even while another request's 8,000-token prompt is being prefilled;
//! 4. samples each sequence's next token on the CPU and streams it back through that request's
//!    channel; finished sequences leave.
//!
//! Drafts (verified semantic reuse): a job may carry candidate answers (answers of similar
//! earlier prompts). The best is appended to the sequence's input after the prompt and fed like
//! prompt tokens, in windows that double while the model agrees (4, 8, 16, ...), with logits
//! from the last prompt token on. Row by row, the sampler chooses the token the model would
//! choose ([`Sampler::verify`]: greedy argmax, or the speculative-sampling rule); while it equals
//! the draft the draft's token is accepted, at the first difference the KV cache is cut back
//! there, the model's token is kept, and another candidate that agrees with everything generated
//! so far takes over (else decoding goes on normally). The output is therefore exactly what the
//! model produces without drafts; an accepted draft token costs a prefill row instead of a
//! decode step.
//!
//! Scoring (EQUIVALENT's check): a job with [`Job::score`] feeds prompt + a given continuation
//! like a prompt (chunked with everyone else's work), reads the log-probability of each
//! continuation token from its row and ends with [`Event::Scored`]; no sampling, no decoding.
//! With [`Job::logprobs`] a generation records the same quantity for every token it chooses, so a
//! stored answer's log-probabilities under its own prompt and a later score are comparable bit
//! for bit.
//!
//! The forward pass is bitwise batch invariant (see `docs/architecture.md`), so a greedy
//! request produces the same tokens alone, in any company, and with any prefill chunking —
//! the same tokens as [`super::generate::generate`]: the same sampling and stop checks in the
//! same order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::fair::{self, RowCost, StepClock, Want};
use super::generate::GenerateError;
pub use super::job::{Draft, Event, Finished, Job, JobError, Scored, SubmitError};
pub use super::job::{LateReceiver, LateSender, LateTicket};
pub use replay::replay_drafts;
use replay::{draft_end, find_continuation};
use crate::background::Background;
use crate::vocab::StopReason;
use super::model::{Logits, Model, RunState, SeqBatch};
use super::sampler::{log_prob, Sampler};
use super::tokenizer::{StreamDecoder, Tokenizer};
use super::KvCache;

mod late;
mod replay;

#[derive(Debug, Clone, Copy)]
pub struct SchedulerConfig {
    /// Requests that may wait for a slot; one more is refused at once.
    pub queue_depth: usize,
    /// Sequences generating at the same time.
    pub max_active: usize,
    /// The most tokens in one forward call (the run state's size); at least `max_active`.
    pub step_tokens: usize,
    /// The wall time a step aims at: prompt chunks shrink as their attention grows, so a new
    /// request waits about one step (not a whole long prompt) before its own prompt starts.
    pub step_time: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { queue_depth: 64, max_active: 8, step_tokens: 128, step_time: Duration::from_millis(125) }
    }
}

/// Draft tokens fed in the first verification window; the window doubles after each step in
/// which the model agreed with all of it.
const FIRST_DRAFT_WINDOW: usize = 4;

/// Generated tokens that must reappear in a candidate for it to be used from there on.
const NGRAM: usize = 3;

struct Queued {
    job: Job,
    at: Instant,
}

/// What the handle and the engine thread share: the waiting requests.
struct Queue {
    waiting: Mutex<Waiting>,
    /// Signalled when a request arrives or the engine is to stop.
    arrived: Condvar,
    /// Sequences in the engine (prefilling or decoding), for metrics.
    active: AtomicUsize,
    /// The engine's measured [`RowCost::row_share`] (f64 bits; NaN: not measured yet).
    row_share: AtomicU64,
}

struct Waiting {
    jobs: VecDeque<Queued>,
    /// The handle was dropped: stop.
    stop: bool,
    /// The engine thread has ended (stopped, or panicked): refuse new requests.
    ended: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Waiting> {
        // A panic while holding the lock leaves plain data in a consistent state.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks the queue ended when the engine thread leaves, however it leaves.
struct EndGuard(Arc<Queue>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        let mut w = self.0.lock();
        w.ended = true;
        // Waiting requests get `None` from their channel: the service reports the engine stopped.
        w.jobs.clear();
    }
}

/// Handle to the engine thread. Dropping it stops the thread (running requests are cancelled).
pub struct Scheduler {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
    config: SchedulerConfig,
}

impl Scheduler {
    /// Starts the engine thread; `model` and `tokenizer` are used only there.
    pub fn start(model: Arc<Model>, tokenizer: Arc<Tokenizer>, config: SchedulerConfig) -> std::io::Result<Scheduler> {
        Scheduler::start_loading(model, Background::ready(tokenizer), config)
    }

    /// As [`Scheduler::start`], with the tokenizer still being built: the engine thread waits for
    /// it before its first step (no job can arrive earlier: a job's prompt is already tokenized).
    /// A tokenizer that fails to build ends the engine: every job is then refused as
    /// [`SubmitError::Stopped`].
    pub fn start_loading(model: Arc<Model>, tokenizer: Background<Arc<Tokenizer>>, config: SchedulerConfig) -> std::io::Result<Scheduler> {
        let config = SchedulerConfig {
            queue_depth: config.queue_depth.max(1),
            max_active: config.max_active.max(1),
            step_tokens: config.step_tokens.max(config.max_active.max(1)),
            step_time: config.step_time,
        };
        let queue = Arc::new(Queue {
            waiting: Mutex::new(Waiting { jobs: VecDeque::new(), stop: false, ended: false }),
            arrived: Condvar::new(),
            active: AtomicUsize::new(0),
            row_share: AtomicU64::new(f64::NAN.to_bits()),
        });
        let q = queue.clone();
        let thread = std::thread::Builder::new().name("forge-engine".into()).spawn(move || {
            let _end = EndGuard(q.clone());
            // Before any step: every forward call of this engine runs the same kernels.
            model.prepare_weights();
            let tokenizer = match tokenizer.get() {
                Ok(t) => t.clone(),
                Err(e) => {
                    tracing::error!(error = %e, "the engine stops: the model's tokenizer did not build");
                    return;
                }
            };
            Engine {
                model: &model,
                tok: &tokenizer,
                config,
                clock: StepClock::new(config.step_time),
                parked: Vec::new(),
                row_cost: RowCost::default(),
                row_share_logged: f64::NAN,
            }
            .run(&q)
        })?;
        Ok(Scheduler { queue, thread: Some(thread), config })
    }

    /// Queues a job, or refuses it at once when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let mut w = self.queue.lock();
        if w.ended || w.stop {
            return Err(SubmitError::Stopped);
        }
        if w.jobs.len() >= self.config.queue_depth {
            return Err(SubmitError::QueueFull(self.config.queue_depth));
        }
        w.jobs.push_back(Queued { job, at: Instant::now() });
        self.queue.arrived.notify_one();
        Ok(())
    }

    /// A channel for drafts that come after the job started ([`Job::late`]; see `late`).
    pub fn late_drafts(&self) -> (LateSender, LateReceiver) {
        let queue = self.queue.clone();
        // Under the queue's lock, so that an engine about to wait sees the drafts or the signal.
        super::job::late_pair(Arc::new(move || {
            let _w = queue.lock();
            queue.arrived.notify_all();
        }))
    }

    /// Jobs waiting for a slot.
    pub fn queued(&self) -> usize {
        self.queue.lock().jobs.len()
    }

    /// Sequences in the engine (prefilling or decoding).
    pub fn active(&self) -> usize {
        self.queue.active.load(Ordering::Relaxed)
    }

    /// What one more row (a draft token fed) costs as a share of a one-row step, measured over
    /// recent steps ([`RowCost`]); `None` until measured.
    pub fn draft_row_share(&self) -> Option<f64> {
        Some(f64::from_bits(self.queue.row_share.load(Ordering::Relaxed))).filter(|r| r.is_finite())
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.queue.lock().stop = true;
        self.queue.arrived.notify_all();
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
    /// Tokens whose keys and values are, or are to be, in `kv` at positions `0..feed.len()`:
    /// the prompt, the generated tokens, then the unchecked part of the current draft.
    feed: Vec<u32>,
    /// Positions of `feed` already run through the model (`kv.len()`).
    fed: usize,
    /// The draft in use (index into `job.drafts`).
    draft: Option<usize>,
    /// (generated index, draft index) that line up: the current draft expects its token
    /// `j + (g - g0)` at generated index `g`.
    align: (usize, usize),
    /// Candidates used so far (bit per index).
    used: u64,
    /// Draft tokens the next step may feed beyond the checked ones.
    window: usize,
    draft_tokens: usize,
    draft_accepted: usize,
    candidates_tried: usize,
    /// Generated tokens (and the stop) the model chose without a draft agreeing.
    own_tokens: usize,
    /// Positions run through the model (rejected draft tokens included).
    computed: usize,
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
    /// Log-probabilities of the chosen tokens (generation with `logprobs`) or of the
    /// continuation's tokens (scoring).
    logprobs: Vec<f32>,
}

impl Seq {
    fn prompt_len(&self) -> usize {
        self.job.prompt.len()
    }

    /// Tokens still to feed.
    fn remaining(&self) -> usize {
        self.feed.len() - self.fed
    }

    /// The token the current draft expects at generated index `g`.
    fn target(&self, g: usize) -> Option<u32> {
        let (g0, j0) = self.align;
        self.draft.and_then(|d| self.job.drafts[d].tokens.get(j0 + g.checked_sub(g0)?).copied())
    }

    /// Where draft `d`'s tokens to feed end: at most as many as a whole answer may have, never
    /// its stop token (a stop is checked, not fed).
    fn draft_end(&self, d: usize) -> usize {
        draft_end(&self.job.drafts[d].tokens, self.job.params.max_tokens, &self.job.params.stop_ids)
    }

    /// Feeds draft `d`'s tokens from its index `j` on, lined up with generated index `g`.
    /// `known`: the token at `g` is the model's own (already chosen), not a guess.
    fn use_draft(&mut self, d: usize, g: usize, j: usize, known: bool) {
        // Never beyond the cache: a draft lined up later than its own start would run past it.
        let end = self.draft_end(d).min(j + self.kv.capacity.saturating_sub(self.feed.len()));
        let before = self.feed.len();
        if j < end {
            self.feed.extend_from_slice(&self.job.drafts[d].tokens[j..end]);
        }
        self.draft_tokens += (self.feed.len() - before).saturating_sub(usize::from(known));
        self.draft = Some(d);
        self.align = (g, j);
        if self.used & (1 << d.min(63)) == 0 {
            self.used |= 1 << d.min(63);
            self.candidates_tried += 1;
        }
    }

    /// After the model chose its own token (generated index `g`, the last of `tokens`): a
    /// candidate that can continue from here — one that agrees with everything generated so
    /// far, else one containing the last [`NGRAM`] generated tokens (answers to similar
    /// questions share phrases, not only beginnings). Returns (candidate, index of the chosen
    /// token in it).
    fn find_continuation(&self, g: usize) -> Option<(usize, usize)> {
        find_continuation(&self.job.drafts, &self.tokens, g, self.job.params.max_tokens, &self.job.params.stop_ids)
    }

    fn send(&self, e: Event) -> bool {
        self.job.events.send(e).is_ok()
    }

    fn late_ready(&self) -> bool {
        self.job.late.as_ref().is_some_and(LateReceiver::ready)
    }
}

struct Engine<'a> {
    model: &'a Model,
    tok: &'a Tokenizer,
    config: SchedulerConfig,
    /// Turns measured step times into the next step's budget.
    clock: StepClock,
    /// Finished sequences waiting for their late drafts (`late`), with how they ended.
    parked: Vec<(Seq, StopReason)>,
    /// Measures what a row costs against a step (published for the draft gate).
    row_cost: RowCost,
    /// The row share last logged (NaN: none yet).
    row_share_logged: f64,
}

/// What happened to a sequence after a token.
enum Next {
    Continue,
    Finish(StopReason),
    Gone,
}

impl Engine<'_> {
    fn run(mut self, queue: &Queue) {
        let mut state: RunState = self.model.new_state(self.config.step_tokens);
        let mut active: Vec<Seq> = Vec::new();
        loop {
            let admitted = {
                let mut w = queue.lock();
                while active.is_empty() && w.jobs.is_empty() && !w.stop && !self.parked.iter().any(|(s, _)| s.late_ready()) {
                    w = queue.arrived.wait(w).unwrap_or_else(|e| e.into_inner());
                }
                if w.stop {
                    return;
                }
                // A request whose client left while it waited is dropped unseen.
                w.jobs.retain(|q| !q.job.events.is_closed());
                let mut running: Vec<String> = active.iter().map(|s| s.job.tenant.clone()).collect();
                let mut admitted = Vec::new();
                loop {
                    let tenants: Vec<&str> = running.iter().map(String::as_str).collect();
                    let Some(i) = fair::pick(w.jobs.iter().map(|q| q.job.tenant.as_str()), &tenants, self.config.max_active) else { break };
                    let Some(q) = w.jobs.remove(i) else { break };
                    running.push(q.job.tenant.clone());
                    admitted.push(q);
                }
                admitted
            };
            // Outside the lock: loading a stored KV prefix may read the disk.
            for q in admitted {
                self.admit(q, &mut active);
            }
            active.retain(|s| !s.job.events.is_closed());
            for s in active.iter_mut() {
                s.attach_late(None);
            }
            self.unpark();
            queue.active.store(active.len(), Ordering::Relaxed);
            if !active.is_empty() {
                self.step(&mut state, &mut active);
                if let Some(r) = self.row_cost.row_share() {
                    queue.row_share.store(r.to_bits(), Ordering::Relaxed);
                    if !((self.row_share_logged - r).abs() < 0.05) {
                        self.row_share_logged = r;
                        tracing::info!(row_share = r, "a draft row costs this share of a one-row step (the draft gate's floor)");
                    }
                }
            }
            queue.active.store(active.len(), Ordering::Relaxed);
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
        if let Some(c) = &job.score {
            if c.is_empty() || job.prompt.len() + c.len() > context {
                return fail(GenerateError::PromptTooLong { prompt: job.prompt.len() + c.len(), context });
            }
        }
        let mut kv = self.model.new_kv(job.prompt.len() + job.params.max_tokens);
        let kv_reused = job.kv.as_mut().map_or(0, |p| super::blend::load(self.model, p.as_mut(), &mut kv, &job.prompt));
        let mut feed = Vec::with_capacity(job.prompt.len() + job.params.max_tokens + 1);
        feed.extend_from_slice(&job.prompt);
        // Scoring feeds the continuation but its last token (whose own row predicts nothing asked).
        let score_len = job.score.as_ref().map_or(0, |c| c.len());
        if let Some(c) = &job.score {
            feed.extend_from_slice(&c[..c.len() - 1]);
        }
        let logprobs = Vec::with_capacity(if job.logprobs { job.params.max_tokens + 1 } else { score_len });
        let mut seq = Seq {
            job,
            kv,
            sampler,
            feed,
            fed: kv_reused,
            kv_reused,
            draft: None,
            align: (0, 0),
            used: 0,
            // A scoring job feeds its whole continuation like a prompt.
            window: if score_len > 0 { score_len } else { FIRST_DRAFT_WINDOW },
            draft_tokens: 0,
            draft_accepted: 0,
            candidates_tried: 0,
            own_tokens: 0,
            computed: 0,
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
            logprobs,
        };
        if !seq.job.drafts.is_empty() {
            seq.use_draft(0, 0, 0, false);
        }
        active.push(seq);
    }

    /// One forward call over every active sequence, then sampling.
    fn step(&mut self, state: &mut RunState, active: &mut Vec<Seq>) {
        // One token of every decoding sequence, then prompt chunks and draft windows, shared
        // fairly within the clock's budget (`fair::split`).
        let wants: Vec<Want<'_>> = active
            .iter()
            .map(|s| Want {
                tenant: &s.job.tenant,
                pos: s.fed,
                tokens: if s.remaining() > 1 { s.remaining().min(s.prompt_len().saturating_sub(s.fed) + s.window) } else { s.remaining() },
                prompt_left: s.prompt_len().saturating_sub(s.fed),
            })
            .collect();
        let budget = self.clock.budget(self.config.max_active as f64);
        let parts = fair::split(&wants, budget, state.max_tokens);
        let units: f64 = wants.iter().zip(&parts).map(|(w, &n)| fair::cost(w.pos, n)).sum();
        drop(wants);
        for (s, part) in active.iter_mut().zip(parts) {
            s.part = part;
        }
        let started = Instant::now();
        let n_seqs = active.iter().filter(|s| s.part > 0).count();
        let mut batch: Vec<SeqBatch<'_>> = active
            .iter_mut()
            .filter(|s| s.part > 0)
            .map(|s| {
                let end = s.fed + s.part;
                let first = s.prompt_len() - 1;
                let logits = if end > first { Logits::From(first.saturating_sub(s.fed)) } else { Logits::None };
                SeqBatch { kv: &mut s.kv, tokens: &s.feed[s.fed..end], logits }
            })
            .collect();
        let result = self.model.forward(state, &mut batch);
        drop(batch);
        let elapsed = started.elapsed();
        tracing::debug!(units, budget, elapsed_ms = elapsed.as_secs_f64() * 1e3, seqs = n_seqs, tokens = ?active.iter().map(|s| (s.fed, s.part)).collect::<Vec<_>>(), "step");
        self.clock.observe(units, budget, elapsed);
        self.row_cost.observe(units, elapsed);
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
            let (start, end) = (s.fed, s.fed + s.part);
            let first_row = start.max(s.prompt_len() - 1);
            let rows = end.saturating_sub(first_row);
            s.fed = end;
            s.computed += s.part;
            if start < s.prompt_len() && end >= s.prompt_len() {
                // The prompt's KV is complete (rows beyond it may hold draft tokens).
                if let Some(p) = s.job.kv.as_mut() {
                    p.publish(&s.kv, &s.job.prompt, &[]);
                }
            }
            if start >= s.prompt_len() {
                s.decode_steps += 1;
            }
            let mut outcome = None;
            for p in first_row..end {
                if s.first_token_at.is_none() {
                    s.first_token_at = Some(Instant::now());
                }
                let logits = self.model.logits(state, row + (p - first_row));
                let next = if s.job.score.is_some() { on_score_row(s, logits, p) } else { self.on_row(s, logits, p) };
                if let Some(n) = next {
                    outcome = Some(n);
                    break;
                }
            }
            row += rows;
            // The first token is out: the submitter may now look for drafts (`late`).
            if let (Some(l), Some(_)) = (&s.job.late, s.first_token_at) {
                l.first_chosen();
            }
            match outcome {
                None | Some(Next::Continue) => {}
                Some(Next::Finish(reason)) => finished.push((i, Some(reason))),
                Some(Next::Gone) => finished.push((i, None)),
            }
        }
        for &(i, reason) in finished.iter().rev() {
            let s = active.remove(i);
            match reason {
                // Its report waits for the drafts it was promised.
                Some(reason) if s.job.late.is_some() => self.parked.push((s, reason)),
                Some(reason) => self.finish(s, reason),
                None => {}
            }
        }
    }

    /// Finishes the parked sequences whose drafts arrived; drops those whose client left.
    fn unpark(&mut self) {
        let mut i = 0;
        while i < self.parked.len() {
            let (s, reason) = &mut self.parked[i];
            if s.job.events.is_closed() {
                self.parked.swap_remove(i);
            } else if s.attach_late(Some(*reason)) {
                let (s, reason) = self.parked.swap_remove(i);
                self.finish(s, reason);
            } else {
                i += 1;
            }
        }
    }

    /// Chooses the token after position `p` from its logits row. `None`: the next row of this
    /// call is still valid (the draft was accepted there); `Some`: stop reading this call's
    /// rows for the sequence (it finished, or the rest of the window was cut off).
    fn on_row(&self, s: &mut Seq, logits: &[f32], p: usize) -> Option<Next> {
        let g = s.tokens.len();
        let stops = &s.job.params.stop_ids;
        let target = s.target(g);
        let chosen = match target {
            Some(t) => s.sampler.verify(logits, t),
            None => s.sampler.sample(logits),
        };
        if s.job.logprobs {
            s.logprobs.push(log_prob(logits, chosen, &s.job.params.stop_ids));
        }
        // Any stop token ends the answer the same way.
        let agreed = target.is_some_and(|t| t == chosen || (stops.contains(&t) && stops.contains(&chosen)));
        if agreed {
            s.draft_accepted += 1;
        } else {
            s.own_tokens += 1;
            // Rows after p followed a token the model did not choose: cut them now, so a
            // sequence that finishes here leaves (and publishes) only its own keys and values.
            s.kv.truncate(p + 1);
            s.feed.truncate(p + 1);
            s.fed = s.fed.min(p + 1);
        }
        match self.on_token(s, chosen) {
            Next::Continue => {}
            other => return Some(other),
        }
        if agreed && p + 1 < s.feed.len() {
            // The draft token at p + 1 is the model's own choice: its row (if fed) is valid.
            if p + 1 < s.fed {
                return None;
            }
            // The whole window was accepted: the next one is twice as long.
            s.window = s.window.saturating_mul(2);
            return Some(Next::Continue);
        }
        // The window's later rows (if any) followed a token the model did not choose.
        s.kv.truncate(p + 1);
        s.feed.truncate(p + 1);
        s.fed = s.fed.min(p + 1);
        let switch = if agreed || s.job.drafts.is_empty() { None } else { s.find_continuation(g) };
        match switch {
            Some((d, j)) => {
                s.window = FIRST_DRAFT_WINDOW;
                s.use_draft(d, g, j, true);
            }
            None => {
                if !agreed {
                    s.draft = None;
                }
                s.feed.push(chosen);
            }
        }
        Some(Next::Continue)
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
        // The new token would be fed at this position (the cache may already hold draft tokens
        // beyond it, so its length says nothing here).
        if s.prompt_len() + s.tokens.len() > s.kv.capacity {
            return Next::Finish(StopReason::ContextFull);
        }
        Next::Continue
    }

    fn finish(&self, mut s: Seq, stop: StopReason) {
        if s.job.score.is_some() {
            let scored = Scored {
                logprobs: std::mem::take(&mut s.logprobs),
                computed: s.computed,
                queue_time: s.admitted_at.duration_since(s.queued_at),
                run_time: s.admitted_at.elapsed(),
                kv_reused: s.kv_reused,
                prefix: s.job.kv.take(),
            };
            let _ = s.send(Event::Scored(scored));
            return;
        }
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
            computed: s.computed,
            draft_tokens: s.draft_tokens,
            draft_accepted: s.draft_accepted,
            candidates_tried: s.candidates_tried,
            served_by: s.draft.filter(|_| s.own_tokens == 0 && s.draft_accepted > 0).map(|d| s.job.drafts[d].clone()),
            partial_source: s
                .draft
                .or((s.candidates_tried > 0).then_some(0))
                .filter(|_| s.own_tokens > 0 && s.draft_accepted > 0)
                .map(|d| s.job.drafts[d].clone()),
            kv_reused: s.kv_reused,
            logprobs: std::mem::take(&mut s.logprobs),
            prefix: s.job.kv.take(),
        };
        let _ = s.send(Event::Done(done));
    }
}

/// A scoring sequence's row `p`: the log-probability of the continuation's token after it.
/// Finishes after the last one.
fn on_score_row(s: &mut Seq, logits: &[f32], p: usize) -> Option<Next> {
    let cont = s.job.score.as_ref()?;
    let i = p + 1 - s.prompt_len();
    s.logprobs.push(log_prob(logits, cont[i], &s.job.params.stop_ids));
    (s.logprobs.len() == cont.len()).then_some(Next::Finish(StopReason::Length))
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
