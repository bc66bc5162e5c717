//! Drafts that arrive after the job started (the semantic lookup taken off the first token's
//! path). A job submitted with a [`LateReceiver`] runs without drafts; its first token is
//! chosen from the prompt's logits alone, and only then is the submitter told
//! ([`LateSender::wait_first`]) to look for drafts: the lookup (an embedding, a KNN search)
//! does not delay the first token. When the drafts arrive ([`LateSender::send`]) the engine
//! attaches them between two steps:
//!
//! - the best draft is compared with the tokens chosen so far, as if it had been fed at
//!   admission: accepted up to the first difference (for greedy decoding, comparing the chosen
//!   token with the draft's is exactly what verification does);
//! - if it agreed with every one, the rest of it is fed for checking as usual; else a candidate
//!   that can continue from the last tokens takes over (the scheduler's n-gram rule).
//!
//! A sequence that finishes before its drafts arrive waits for them ("parked", computing
//! nothing) so that its report says what the drafts were worth, exactly as if they had come at
//! admission: the same answer is then VERIFIED, PARTIAL or MODEL whenever the drafts arrive.
//! Attaching never changes a token: the model's own choices are only compared, never replaced.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{Queue, Seq, FIRST_DRAFT_WINDOW};
use crate::engine::job::Draft;
use crate::vocab::StopReason;

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

/// The engine's end, carried by [`crate::engine::job::Job::late`].
#[derive(Debug)]
pub struct LateReceiver {
    slot: Arc<Slot>,
}

/// The submitter's end. Dropped without [`LateSender::send`], it delivers no drafts (the job
/// never waits for it in vain).
pub struct LateSender {
    slot: Arc<Slot>,
    queue: Arc<Queue>,
    sent: bool,
}

/// After [`LateSender::send`]: whether the engine took the drafts.
pub struct LateTicket {
    slot: Arc<Slot>,
}

pub(super) fn pair(queue: Arc<Queue>) -> (LateSender, LateReceiver) {
    let slot = Arc::new(Slot { state: Mutex::new(State::Waiting), changed: Condvar::new() });
    (LateSender { slot: slot.clone(), queue, sent: false }, LateReceiver { slot })
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
        // Under the queue's lock, so that an engine about to wait sees the drafts or the signal.
        let _w = self.queue.lock();
        self.queue.arrived.notify_all();
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

impl Seq {
    /// Takes the late drafts if they arrived and attaches them. Between steps only: the last
    /// chosen token (if any) is the one unfed token of `feed`. `stop`: the sequence has finished
    /// (parked) for this reason; nothing more is fed then, the drafts are only compared.
    pub(super) fn attach_late(&mut self, stop: Option<StopReason>) -> bool {
        let Some(drafts) = self.job.late.as_ref().and_then(LateReceiver::take) else { return false };
        self.job.late = None;
        if drafts.is_empty() {
            return true;
        }
        self.job.drafts = drafts;
        let g = self.tokens.len();
        if g == 0 && stop.is_none() {
            // Nothing chosen yet: as if the drafts had come at admission.
            self.use_draft(0, 0, 0, false);
            return true;
        }
        // The rows the model chose so far (the tokens, then a stop token if it ended on one),
        // checked against the best draft as if it had been fed at admission: accepted up to the
        // first difference.
        let stopped = stop == Some(StopReason::Stop) && !self.cut;
        let rows = g + usize::from(stopped);
        let stops = &self.job.params.stop_ids;
        let best = &self.job.drafts[0].tokens;
        let agreed = (0..rows)
            .take_while(|&i| match self.tokens.get(i) {
                Some(t) => best.get(i) == Some(t),
                None => best.get(i).is_some_and(|t| stops.contains(t)),
            })
            .count();
        self.own_tokens = self.own_tokens.saturating_sub(agreed);
        self.draft_accepted += agreed;
        self.used |= 1;
        self.candidates_tried += 1;
        // Fed to check those rows: the draft's tokens before each, and the one rejected (a stop
        // is checked, never fed).
        let end0 = self.draft_end(0);
        self.draft_tokens += if agreed == rows { g.min(end0) } else { (agreed + 1).min(end0) };
        if agreed == rows {
            self.draft = Some(0);
            self.align = (0, 0);
            if stop.is_none() {
                let end = end0.min(g + self.kv.capacity.saturating_sub(self.feed.len()));
                if g < end {
                    self.feed.extend_from_slice(&self.job.drafts[0].tokens[g..end]);
                    self.draft_tokens += end - g;
                }
            }
            return true;
        }
        if stop.is_none() && g > 0 {
            if let Some((d, j)) = self.find_continuation(g - 1) {
                // Fed again from the draft, as its own token at `j`.
                self.feed.pop();
                self.window = FIRST_DRAFT_WINDOW;
                self.use_draft(d, g - 1, j, true);
            }
        }
        true
    }
}
