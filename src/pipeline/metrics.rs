//! The service's Prometheus metrics (the `prometheus` crate: one registry per pipeline, so two
//! services in one process never mix their numbers). Counters only grow; hit rates are for the
//! scraper to compute (`rate(forge_requests_total{served_from="EXACT"}[5m]) /
//! rate(forge_requests_total[5m])`). Every request counter is bumped in one place — when the
//! request is recorded (`record.rs`) — so over one process's life on a fresh database the
//! counters equal `forge-cache stats --json` for that database.

use std::time::Duration;

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use super::error::ServiceError;
use super::request::Outcome;
use crate::workload::plan::ReportData;

/// Bucket bounds in seconds: 0.5 ms (an exact hit inside the server) to 60 s (a long answer).
const SECONDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The stages timed by `forge_stage_seconds`:
/// `tokenize` is observed only for requests whose answer needed the prompt's tokens (not an EXACT
/// hit whose row kept them); `tokenizer_wait` only for those that waited for the tokenizer to be
/// built (just after start-up).
pub const STAGES: [&str; 9] = ["validate", "tokenizer_wait", "tokenize", "lookup", "embed", "queue", "prefill", "decode", "record"];

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    rejected: IntCounterVec,
    prompt_tokens: IntCounterVec,
    completion_tokens: IntCounterVec,
    tokens_computed: IntCounterVec,
    tokens_reused: IntCounterVec,
    tokens_saved: IntCounterVec,
    kv_tokens_reused: IntCounterVec,
    kv_block_hits: IntCounterVec,
    kv_prompt_blocks: IntCounterVec,
    kv_blocks_corrupt: IntCounterVec,
    draft_tokens: IntCounterVec,
    draft_tokens_accepted: IntCounterVec,
    lookups_after_first_token: IntCounterVec,
    queue_depth: IntGauge,
    active_sequences: IntGauge,
    in_flight: IntGauge,
    kv_memory_bytes: IntGauge,
    ttft: HistogramVec,
    latency: HistogramVec,
    stage: HistogramVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter definition");
    r.register(Box::new(c.clone())).expect("metric names are unique");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge definition");
    r.register(Box::new(g.clone())).expect("metric names are unique");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(SECONDS.to_vec()), labels).expect("valid histogram definition");
    r.register(Box::new(h.clone())).expect("metric names are unique");
    h
}

/// The `code` label of a refused request (the gRPC code's name in snake case).
fn refusal_code(e: &ServiceError) -> &'static str {
    match e {
        ServiceError::InvalidArgument(_) => "invalid_argument",
        ServiceError::Unauthenticated(_) => "unauthenticated",
        ServiceError::PermissionDenied(_) => "permission_denied",
        ServiceError::UnknownModel { .. } => "not_found",
        ServiceError::Submit(crate::engine::scheduler::SubmitError::QueueFull(_)) => "resource_exhausted",
        ServiceError::Submit(_) => "unavailable",
        ServiceError::Store(_) | ServiceError::Job(_) | ServiceError::Internal(_) => "internal",
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let by_tier = &["tenant", "served_from"];
        Metrics {
            requests: counter(&r, "forge_requests_total", "Requests recorded, by tenant and the tier that served them", by_tier),
            rejected: counter(&r, "forge_requests_rejected_total", "Requests refused before an answer (nothing recorded), by error code", &["code"]),
            prompt_tokens: counter(&r, "forge_prompt_tokens_total", "Prompt tokens of recorded requests", by_tier),
            completion_tokens: counter(&r, "forge_completion_tokens_total", "Completion tokens of recorded requests", by_tier),
            tokens_computed: counter(&r, "forge_tokens_computed_total", "Positions the model computed (prompt, decode, checked drafts)", by_tier),
            tokens_reused: counter(&r, "forge_tokens_reused_total", "Tokens whose computation was reused instead of redone", by_tier),
            tokens_saved: counter(&r, "forge_tokens_saved_total", "Tokens saved by every cache (stats' tokens_saved)", &["tenant"]),
            kv_tokens_reused: counter(&r, "forge_kv_tokens_reused_total", "Prompt tokens whose KV came from stored blocks", by_tier),
            kv_block_hits: counter(&r, "forge_kv_block_hits_total", "Prompt KV blocks found, by the tier they came from (memory, disk)", &["tenant", "tier"]),
            kv_prompt_blocks: counter(&r, "forge_kv_prompt_blocks_total", "Whole KV blocks in the prompts the engine ran", &["tenant"]),
            kv_blocks_corrupt: counter(&r, "forge_kv_blocks_corrupt_total", "Stored KV blocks that failed their checksum (recomputed)", &["tenant"]),
            draft_tokens: counter(&r, "forge_draft_tokens_total", "Draft tokens (neighbours' answers) proposed to the model", &["tenant"]),
            draft_tokens_accepted: counter(&r, "forge_draft_tokens_accepted_total", "Draft tokens the model agreed with", &["tenant"]),
            lookups_after_first_token: counter(
                &r,
                "forge_semantic_lookups_late_total",
                "Semantic lookups not run before the engine: deferred (after the first token) or skipped (the draft gate skips drafts everywhere)",
                &["tenant", "lookup"],
            ),
            queue_depth: gauge(&r, "forge_queue_depth", "Requests waiting for the engine"),
            active_sequences: gauge(&r, "forge_active_sequences", "Sequences in the engine (prefilling or decoding)"),
            in_flight: gauge(&r, "forge_requests_in_flight", "Requests between arrival and their last piece"),
            kv_memory_bytes: gauge(&r, "forge_kv_memory_bytes", "Bytes of KV blocks held in memory"),
            ttft: histogram(&r, "forge_time_to_first_token_seconds", "Request received to its first token", &["served_from"]),
            latency: histogram(&r, "forge_request_duration_seconds", "Request received to its outcome (end to end)", &["served_from"]),
            stage: histogram(&r, "forge_stage_seconds", "Time in each stage: validate, tokenizer_wait, tokenize, lookup, embed, queue, prefill, decode, record", &["stage"]),
            registry: r,
        }
    }

    /// A recorded request: its counters and histograms. `engine` = (queue, prefill, decode).
    pub(crate) fn request(&self, tenant: &str, o: &Outcome, engine: (Duration, Duration, Duration)) {
        let tier = o.served_from.as_str();
        let labels = &[tenant, tier];
        self.requests.with_label_values(labels).inc();
        self.prompt_tokens.with_label_values(labels).inc_by(o.prompt_token_ids.len() as u64);
        self.completion_tokens.with_label_values(labels).inc_by(o.completion_tokens as u64);
        self.tokens_computed.with_label_values(labels).inc_by(o.tokens_computed as u64);
        self.tokens_reused.with_label_values(labels).inc_by(o.tokens_reused as u64);
        self.kv_tokens_reused.with_label_values(labels).inc_by(o.kv_tokens_reused as u64);
        self.tokens_saved.with_label_values(&[tenant]).inc_by(o.tokens_reused as u64);
        self.draft_tokens.with_label_values(&[tenant]).inc_by(o.draft_tokens as u64);
        self.draft_tokens_accepted.with_label_values(&[tenant]).inc_by(o.draft_tokens_accepted as u64);
        if let Some(t) = o.ttft_ms {
            self.ttft.with_label_values(&[tier]).observe(t / 1e3);
        }
        self.latency.with_label_values(&[tier]).observe(o.latency_ms / 1e3);
        if o.served_from.computed() {
            for (stage, d) in [("queue", engine.0), ("prefill", engine.1), ("decode", engine.2)] {
                self.stage(stage, d);
            }
        }
    }

    /// The KV blocks of a recorded request (the numbers `kv_requests` holds).
    pub(crate) fn kv_blocks(&self, tenant: &str, r: &ReportData) {
        self.kv_prompt_blocks.with_label_values(&[tenant]).inc_by(r.prompt_blocks as u64);
        self.kv_block_hits.with_label_values(&[tenant, "memory"]).inc_by(r.blocks_memory as u64);
        self.kv_block_hits.with_label_values(&[tenant, "disk"]).inc_by(r.blocks_disk as u64);
        self.kv_blocks_corrupt.with_label_values(&[tenant]).inc_by(r.blocks_corrupt as u64);
    }

    /// A request refused before it had an answer (nothing recorded).
    pub fn rejected(&self, e: &ServiceError) {
        self.rejected_code(refusal_code(e));
    }

    /// A semantic lookup that did not run before the engine: `skipped` altogether, else deferred.
    pub(crate) fn lookup(&self, tenant: &str, skipped: bool) {
        self.lookups_after_first_token.with_label_values(&[tenant, if skipped { "skipped" } else { "deferred" }]).inc();
    }

    /// A request a front end refused before the pipeline saw it (e.g. malformed JSON).
    pub fn rejected_code(&self, code: &str) {
        self.rejected.with_label_values(&[code]).inc();
    }

    pub(crate) fn stage(&self, stage: &str, d: Duration) {
        self.stage.with_label_values(&[stage]).observe(d.as_secs_f64());
    }

    /// The text exposition (Prometheus format 0.0.4), the gauges set to the values given.
    pub(crate) fn render(&self, queued: usize, active: usize, in_flight: usize, kv_memory_bytes: Option<u64>) -> String {
        self.queue_depth.set(queued as i64);
        self.active_sequences.set(active as i64);
        self.in_flight.set(in_flight as i64);
        self.kv_memory_bytes.set(kv_memory_bytes.unwrap_or(0) as i64);
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding the metrics failed");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::{CacheMode, ServedFrom, StopReason};

    #[test]
    fn counters_add_up_per_tenant_and_tier() {
        let m = Metrics::new();
        let mut o = Outcome {
            served_from: ServedFrom::Model,
            stop_reason: StopReason::Stop,
            cache_mode: CacheMode::Auto,
            inference_id: 1,
            source_inference_id: None,
            source_fact_id: None,
            similarity: 0.0,
            prompt_token_ids: vec![1, 2, 3],
            completion_tokens: 4,
            tokens_computed: 7,
            tokens_reused: 0,
            kv_tokens_reused: 0,
            blend_tokens_reused: 0,
            blend_tokens_recomputed: 0,
            queue_ms: 0.1,
            prefill_ms: 1.0,
            decode_ms: 2.0,
            latency_ms: 3.5,
            ttft_ms: Some(1.5),
            peak_batch: 1,
            model: "m".into(),
            backend: "cpu".into(),
            draft_tokens: 0,
            draft_tokens_accepted: 0,
            candidates_tried: 0,
            equivalence: None,
            equivalence_checks: 0,
        };
        m.request("acme", &o, (Duration::ZERO, Duration::from_millis(1), Duration::from_millis(2)));
        o.served_from = ServedFrom::Exact;
        o.tokens_computed = 0;
        o.tokens_reused = 7;
        m.request("acme", &o, (Duration::ZERO, Duration::ZERO, Duration::ZERO));
        m.rejected(&ServiceError::InvalidArgument("x".into()));
        let text = m.render(2, 1, 0, None);
        for line in [
            "forge_requests_total{served_from=\"MODEL\",tenant=\"acme\"} 1",
            "forge_requests_total{served_from=\"EXACT\",tenant=\"acme\"} 1",
            "forge_tokens_computed_total{served_from=\"MODEL\",tenant=\"acme\"} 7",
            "forge_tokens_saved_total{tenant=\"acme\"} 7",
            "forge_requests_rejected_total{code=\"invalid_argument\"} 1",
            "forge_queue_depth 2",
            "forge_active_sequences 1",
            "forge_stage_seconds_count{stage=\"prefill\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
