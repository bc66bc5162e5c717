//! The semantic lookup off the first token's path. When a request's stored KV prefix covers
//! nearly its whole prompt, the model has only a few tokens to compute before its first token,
//! and the lookup (embedding the question — up to 256 MiniLM tokens of a message that may hold a
//! whole document — then the KNN search) would take longer than that: measured on bench-kv,
//! ~50-60% of such a request's time to first token. Such a request starts at once without
//! drafts; the lookup runs on the blocking pool once its first token is chosen, and its drafts
//! reach the running sequence late (`engine::scheduler::late`), where they are checked like
//! drafts given at admission. Output is unchanged (drafts never change a token); the report
//! (VERIFIED, PARTIAL, MODEL; drafts accepted) and what TRUST learns are the same whenever the
//! drafts arrive, because a sequence that finishes first waits for them.
//!
//! The same path serves a greedy request of a tenant whose draft gate skips drafts at every
//! similarity (`cache::skip`) when it explores (`--lookup-explore`, a share of such requests):
//! its lookup could only find that drafts are skipped, so the embedding and the KNN search leave
//! the first token's path too. Such a request that does not explore skips the lookup (and the
//! semantic recording) altogether: [`Lookup::Skipped`].
//!
//! Only in modes where the semantic tier can do nothing but offer drafts (AUTO, VERIFIED):
//! TRUST and EQUIVALENT may answer without the model, so they look up first as before.

use std::sync::Arc;

use tokio::task::JoinHandle;

use super::kv::Kv;
use super::tiers::Found;
use super::validation::Plan;
use super::Pipeline;
use crate::engine::scheduler::{LateSender, LateTicket};
use crate::vocab::CacheMode;

/// The share of the prompt a stored prefix must cover for the lookup to wait for the first
/// token: below it the prefill of the rest takes longer than the lookup, and drafts given at
/// admission are checked within the prompt's own steps.
const COVERED: f64 = 0.9;

/// A lookup running beside the engine: the plan as the lookup left it (embedding, nearest
/// neighbour), and whether the engine took its drafts.
pub(super) type Deferred = JoinHandle<Option<(Plan, Option<LateTicket>)>>;

/// When a request's semantic lookup runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Before the engine starts (drafts at admission; TRUST and EQUIVALENT may answer).
    Now,
    /// Beside the engine, after the first token ([`Pipeline::spawn_lookup`]).
    Deferred,
    /// Not at all: the draft gate skips drafts at every similarity and this request does not
    /// explore; it is decoded as BYPASS would and files nothing in the semantic tier.
    Skipped,
}

impl Pipeline {
    /// Whether this request's semantic lookup can only offer drafts (so it may come late).
    pub(super) fn lookup_may_wait(&self, plan: &Plan) -> bool {
        matches!(plan.mode, CacheMode::Auto | CacheMode::Verified) && self.semantic.is_some() && plan.scope.is_some() && plan.question.is_some()
    }

    /// When the lookup runs: after the first token when the stored prefix `kv` leaves so little
    /// to compute that the lookup would take longer; for a greedy request whose draft gate skips
    /// drafts at every similarity (the lookup can give nothing), after the first token on the
    /// gate's exploration share (the question is filed, the skipped drafts are replayed), else
    /// not at all.
    pub(super) fn lookup_timing(&self, plan: &Plan, kv: Option<&Kv>) -> Lookup {
        if !self.lookup_may_wait(plan) {
            return Lookup::Now;
        }
        if let Some(sem) = &self.semantic {
            let skips = plan.params.sampling.is_greedy()
                && sem.drafts.skips_everywhere(&self.store, &plan.tenant, &self.model_id, self.scheduler.draft_row_share()).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "reading the draft gate failed; looking up first");
                    false
                });
            if skips {
                return if sem.drafts.explores_lookup() { Lookup::Deferred } else { Lookup::Skipped };
            }
        }
        match kv {
            Some(Kv::Prefix(k)) if k.report().reused_tokens as f64 >= COVERED * plan.prompt_ids.len() as f64 => Lookup::Deferred,
            _ => Lookup::Now,
        }
    }

    /// Starts the lookup of `plan` (a copy of the running request's): it waits until the first
    /// token is chosen, then sends the drafts it finds through `tx`.
    pub(super) fn spawn_lookup(self: &Arc<Self>, mut plan: Plan, tx: LateSender) -> Deferred {
        let state = self.clone();
        let span = tracing::Span::current();
        tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            if !tx.wait_first() {
                return None;
            }
            // Timed as the `embed` stage inside; `lookup` was timed before the job started.
            let found = tracing::debug_span!("lookup").in_scope(|| state.lookup_similar(&mut plan));
            let drafts = match found {
                Ok(Found::Drafts(d)) => d,
                Ok(_) => Vec::new(),
                Err(e) => {
                    tracing::warn!(error = %e, "the deferred semantic lookup failed; no drafts");
                    Vec::new()
                }
            };
            let ticket = tx.send(drafts);
            Some((plan, Some(ticket)))
        })
    }

    /// The plan to record a deferred request with: the lookup's (its embedding is filed for
    /// later neighbours), whose nearest neighbour counts as checked only if the engine took the
    /// drafts.
    pub(super) async fn after_lookup(plan: Arc<Plan>, deferred: Option<Deferred>) -> Arc<Plan> {
        let Some(handle) = deferred else { return plan };
        match handle.await {
            Ok(Some((mut looked, ticket))) => {
                if !ticket.is_some_and(|t| t.taken()) {
                    looked.top = None;
                }
                Arc::new(looked)
            }
            _ => plan,
        }
    }
}
