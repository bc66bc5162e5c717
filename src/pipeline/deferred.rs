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
//! similarity (`cache::skip`): its lookup could only find that drafts are skipped, so the
//! embedding and the KNN search leave the first token's path too.
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

impl Pipeline {
    /// Whether this request's semantic lookup can only offer drafts (so it may come late).
    pub(super) fn lookup_may_wait(&self, plan: &Plan) -> bool {
        matches!(plan.mode, CacheMode::Auto | CacheMode::Verified) && self.semantic.is_some() && plan.scope.is_some() && plan.question.is_some()
    }

    /// Whether the lookup should wait for the first token: the stored prefix `kv` leaves so
    /// little to compute that the lookup would take longer, or (greedy requests) the draft gate
    /// skips drafts at every similarity, so the lookup can give nothing before the first token
    /// (it still runs: the question's embedding is filed, and the skipped drafts are replayed).
    pub(super) fn defers_lookup(&self, plan: &Plan, kv: Option<&Kv>) -> bool {
        if !self.lookup_may_wait(plan) {
            return false;
        }
        if let Some(Kv::Prefix(k)) = kv {
            if k.report().reused_tokens as f64 >= COVERED * plan.prompt_ids.len() as f64 {
                return true;
            }
        }
        let Some(sem) = &self.semantic else { return false };
        plan.params.sampling.is_greedy()
            && sem.drafts.skips_everywhere(&self.store, &plan.tenant, &self.model_id, self.scheduler.draft_row_share()).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "reading the draft gate failed; looking up first");
                false
            })
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
