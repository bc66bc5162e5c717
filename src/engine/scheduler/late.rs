//! Drafts that arrive after the job started (the semantic lookup taken off the first token's
//! path), attached by the engine; the channel itself is [`crate::engine::job::LateReceiver`] /
//! [`crate::engine::job::LateSender`]. A job submitted with a [`LateReceiver`] runs without
//! drafts; its first token is chosen from the prompt's logits alone, and only then is the
//! submitter told (`LateSender::wait_first`) to look for drafts: the lookup (an embedding, a KNN
//! search) does not delay the first token. When the drafts arrive (`LateSender::send`) the
//! engine attaches them between two steps:
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

use super::{Seq, FIRST_DRAFT_WINDOW};
use crate::engine::job::LateReceiver;
use crate::vocab::StopReason;

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
