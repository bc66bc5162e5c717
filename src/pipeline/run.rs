//! One request through the stages: validation, the tiers, the engine job, recording. Answers
//! from a cache are recorded on the blocking thread that found them and come back as two
//! pieces (the text, then the outcome); the engine's answers stream token by token and the
//! last piece carries the rest of the text and the outcome. A client that goes away cancels
//! the sequence; the partial answer is recorded as `cancelled` and never served from a cache.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

use super::error::ServiceError;
use super::record::Answer;
use super::request::{Chunk, Generation, Outcome, Request};
use super::deferred::Lookup;
use super::kv::Kv;
use super::tiers::Found;
use super::validation::Plan;
use super::Pipeline;
use crate::engine::scheduler::{Event, Job};
use crate::vocab::{CacheMode, ServedFrom, StopReason};
use crate::workload::{BlendPlan, KvPlan, ReportData};

/// Pieces buffered towards a slow client before generation waits for it.
const STREAM_BUFFER: usize = 64;

/// Counts a request as in progress until dropped (the fact indexer waits for zero).
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(n: &Arc<AtomicUsize>) -> InFlight {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request after the caches: its answer, or what the engine needs (the last field: its
/// semantic lookup waits for the first token, `deferred`).
enum Served {
    Cached(String, Vec<u32>, Outcome),
    Model(Plan, Vec<crate::engine::scheduler::Draft>, Option<Kv>, bool),
}

fn chunk(text: String, token_ids: Vec<u32>, outcome: Option<Outcome>) -> Chunk {
    Chunk { text, token_ids, outcome: outcome.map(Box::new) }
}

impl Pipeline {
    /// Serves `req` for `tenant` (already resolved by the front end): the first tier that can,
    /// else the engine. Errors before the first piece (validation, a full queue) come back
    /// here; errors after it end the stream.
    pub async fn generate(self: &Arc<Self>, tenant: String, req: Request) -> Result<Generation, ServiceError> {
        let received = Instant::now();
        let request_id = self.request_id();
        let span = tracing::info_span!("request", id = request_id, tenant = %tenant);
        let guard = InFlight::new(&self.in_flight);
        let state = self.clone();
        let blocking_span = span.clone();
        let served = tokio::task::spawn_blocking(move || -> Result<_, ServiceError> {
            let _entered = blocking_span.enter();
            let t = Instant::now();
            let mut plan = tracing::debug_span!("validate").in_scope(|| state.validate(request_id, tenant, &req, received))?;
            state.metrics.stage("validate", t.elapsed());
            // FACT and EXACT by the prompt's text; only then the prompt's tokens (an EXACT hit
            // does not wait for a tokenizer still being built), then the semantic tier.
            let t = Instant::now();
            let stored = tracing::debug_span!("lookup").in_scope(|| state.lookup_stored(&mut plan))?;
            let mut lookup = t.elapsed();
            // Prepared before the semantic tier where that can only offer drafts: a prefix that
            // covers nearly the whole prompt sends the lookup off the first token's path.
            let mut early_kv = None;
            let found = match stored {
                Some(answer) => Found::Answer(answer),
                None => {
                    tracing::debug_span!("tokenize").in_scope(|| state.tokenize(&mut plan))?;
                    if state.lookup_may_wait(&plan) {
                        let kv = state.prepare_kv(&plan);
                        match state.lookup_timing(&plan, kv.as_ref()) {
                            Lookup::Now => early_kv = Some(kv),
                            later => {
                                state.metrics.stage("lookup", lookup);
                                plan.lookup_skipped = later == Lookup::Skipped;
                                state.metrics.lookup(&plan.tenant, later == Lookup::Skipped);
                                return Ok(Served::Model(plan, Vec::new(), kv, later == Lookup::Deferred));
                            }
                        }
                    }
                    let t = Instant::now();
                    let found = tracing::debug_span!("lookup").in_scope(|| state.lookup_similar(&mut plan))?;
                    lookup += t.elapsed();
                    found
                }
            };
            state.metrics.stage("lookup", lookup);
            let drafts = match found {
                Found::Answer(answer) => {
                    let (text, tokens) = (answer.text.clone(), answer.tokens.clone());
                    let outcome = state.record_now(&plan, answer)?;
                    return Ok(Served::Cached(text, tokens, outcome));
                }
                Found::Drafts(d) => d,
                Found::Nothing => Vec::new(),
            };
            let kv = early_kv.unwrap_or_else(|| state.prepare_kv(&plan));
            Ok(Served::Model(plan, drafts, kv, false))
        })
        .await?;
        let served = match served {
            Ok(s) => s,
            Err(e) => {
                let _entered = span.enter();
                self.metrics.rejected(&e);
                tracing::info!(error = %e, "request refused");
                return Err(e);
            }
        };
        let (plan, drafts, kv, deferred) = match served {
            Served::Cached(text, tokens, outcome) => {
                let (from, mode) = (outcome.served_from, outcome.cache_mode);
                let pieces = [chunk(text, tokens, None), chunk(String::new(), Vec::new(), Some(outcome))];
                return Ok(Generation {
                    request_id,
                    cache_mode: mode,
                    served_from: Some(from),
                    chunks: Box::pin(tokio_stream::iter(pieces.map(Ok))),
                });
            }
            Served::Model(plan, drafts, kv, deferred) => {
                let deferred = deferred.then(|| {
                    let (tx, rx) = self.scheduler.late_drafts();
                    (self.spawn_lookup(plan.clone(), tx), rx)
                });
                (Arc::new(plan), drafts, kv, deferred)
            }
        };
        // What reuse is planned, kept for a request whose client goes away (its plan stays with
        // the cancelled sequence).
        let planned = match &kv {
            Some(Kv::Prefix(k)) => Some(ReportData { new_blocks: Vec::new(), ..k.report().clone() }),
            _ => None,
        };
        let (events_tx, events) = mpsc::unbounded_channel();
        let job = Job {
            prompt: plan.prompt_ids.clone(),
            params: plan.params.clone(),
            stop_strings: plan.stop_strings.clone(),
            events: events_tx,
            drafts,
            kv: kv.map(Kv::into_cache),
            tenant: plan.tenant.clone(),
            // The answer's log-probabilities are what EQUIVALENT compares a later paraphrase's
            // scores with (and the fresh answer's likelihood when it explores).
            // BLEND's lossy answers are never candidates: nothing to compare with.
            // A request that skipped the semantic tier files nothing a later check could use.
            logprobs: !matches!(plan.mode, CacheMode::Bypass | CacheMode::Blend) && !plan.lookup_skipped,
            score: None,
            late: None,
        };
        let (job, deferred) = match deferred {
            Some((lookup, rx)) => (Job { late: Some(rx), ..job }, Some(lookup)),
            None => (job, None),
        };
        if let Err(e) = self.scheduler.submit(job) {
            let e = ServiceError::from(e);
            self.metrics.rejected(&e);
            let _entered = span.enter();
            tracing::info!(error = %e, "request refused");
            return Err(e);
        }
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        let mode = plan.mode;
        tokio::spawn(self.clone().stream_model(plan, planned, deferred, events, out, guard).instrument(span));
        Ok(Generation { request_id, cache_mode: mode, served_from: None, chunks: Box::pin(ReceiverStream::new(rx)) })
    }

    /// The KV plan of a request the model will compute: its longest stored prefix (memory, then
    /// disk), or for BLEND its documents' stored KV. Blocking.
    pub(super) fn prepare_kv(&self, plan: &Plan) -> Option<Kv> {
        let kv = self.kv.as_ref().filter(|_| plan.kv_reuse)?;
        if plan.mode == CacheMode::Blend {
            return Some(Kv::Blend(kv.prepare_blend(&plan.tenant, &plan.prompt_ids, &plan.chunks, plan.blend_recompute)));
        }
        Some(Kv::Prefix(kv.prepare(&plan.tenant, &plan.prompt_ids)))
    }

    /// Forwards the engine's events to the client; records the answer at the end, or the partial
    /// answer when the client goes away (dropping `events` cancels the sequence).
    async fn stream_model(
        self: Arc<Self>,
        plan: Arc<Plan>,
        planned: Option<ReportData>,
        deferred: Option<super::deferred::Deferred>,
        mut events: mpsc::UnboundedReceiver<Event>,
        out: mpsc::Sender<Result<Chunk, ServiceError>>,
        in_flight: InFlight,
    ) {
        let mut sent_text = String::new();
        let mut sent_ids = Vec::new();
        let mut ttft = None;
        loop {
            let event = tokio::select! {
                biased;
                _ = out.closed() => break,
                e = events.recv() => e,
            };
            match event {
                Some(Event::Token { id, text }) => {
                    ttft.get_or_insert_with(|| plan.received.elapsed());
                    sent_text.push_str(&text);
                    sent_ids.push(id);
                    if out.send(Ok(chunk(text, vec![id], None))).await.is_err() {
                        break;
                    }
                }
                Some(Event::Done(mut f)) => {
                    let (kv, blend) = match f.prefix.take().map(|p| p.into_any()) {
                        Some(any) => match any.downcast::<KvPlan>() {
                            Ok(p) => (Some(p.into_report()), None),
                            Err(any) => (None, any.downcast::<BlendPlan>().ok().map(|b| b.data())),
                        },
                        None => (None, None),
                    };
                    let tail = f.text.get(sent_text.len()..).unwrap_or_default().to_string();
                    let (from, source) = match (&f.served_by, &f.partial_source) {
                        (Some(d), _) => (ServedFrom::Verified, Some(d)),
                        (None, Some(d)) => (ServedFrom::Partial, Some(d)),
                        (None, None) if plan.mode == CacheMode::Blend => (ServedFrom::Blend, None),
                        (None, None) => (ServedFrom::Model, None),
                    };
                    // BLEND: the scheduler fed the last prompt token; the blend computed the rest
                    // of the prompt outside the documents and the recomputed document tokens.
                    let (computed, reused, kv_reused) = match &blend {
                        Some(b) if b.engine.fallback.is_none() => {
                            let e = &b.engine;
                            (f.computed + e.other.saturating_sub(1) + e.recomputed + e.span_computed, e.reused, e.reused)
                        }
                        Some(_) => (f.computed, 0, 0),
                        None => (f.computed, f.draft_accepted + f.kv_reused, f.kv_reused),
                    };
                    let answer = Answer {
                        from,
                        text: f.text,
                        tokens: f.tokens,
                        stop: f.stop,
                        source_inference_id: source.map(|d| d.source),
                        source_fact_id: None,
                        tokens_computed: computed,
                        tokens_reused: reused,
                        queue: f.queue_time,
                        prefill: f.prefill_time,
                        decode: f.decode_time,
                        peak_batch: f.peak_batch,
                        ttft: ttft.or_else(|| Some(plan.received.elapsed())),
                        kv_tokens_reused: kv_reused,
                        draft_tokens: f.draft_tokens,
                        draft_accepted: f.draft_accepted,
                        candidates_tried: f.candidates_tried,
                        similarity: source.map(|d| d.similarity),
                        logprobs: Some(f.logprobs),
                        equivalence: None,
                        kv,
                        blend,
                    };
                    let plan = Self::after_lookup(plan, deferred).await;
                    let last = self.record(plan, answer).await.map(|outcome| chunk(tail, Vec::new(), Some(outcome)));
                    // Done before the client hears so: its next request finds the service idle.
                    drop(in_flight);
                    let _ = out.send(last).await;
                    return;
                }
                Some(Event::Scored(_)) => {
                    let _ = out.send(Err(ServiceError::Internal("a generation job ended as a scoring job".into()))).await;
                    return;
                }
                Some(Event::Failed(e)) => {
                    let _ = out.send(Err(ServiceError::Job(e))).await;
                    return;
                }
                None => {
                    let _ = out.send(Err(ServiceError::Internal("the engine stopped".into()))).await;
                    return;
                }
            }
        }
        // The client went away.
        drop(events);
        let reused = planned.as_ref().map_or(0, |r| r.reused_tokens);
        let computed = plan.prompt_ids.len() - reused + sent_ids.len().saturating_sub(1);
        let from = if plan.mode == CacheMode::Blend { ServedFrom::Blend } else { ServedFrom::Model };
        let mut answer = Answer::stored(from, sent_text, sent_ids, StopReason::Cancelled, reused);
        answer.tokens_computed = computed;
        answer.kv_tokens_reused = reused;
        answer.ttft = ttft;
        answer.kv = planned;
        if let Err(e) = self.record(plan, answer).await {
            tracing::warn!(error = %e, "recording a cancelled request failed");
        }
    }
}
