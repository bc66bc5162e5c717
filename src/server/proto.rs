//! The generated gRPC code for `proto/forge/v1/forge.proto` (tonic + prost), its encoded file
//! descriptor set (served by reflection), and conversions between its enums and the library's.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("forge.v1");

/// The encoded `FileDescriptorSet` of forge.proto, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("forge_descriptor");

use crate::pipeline;
use crate::store;
use crate::vocab;

impl From<vocab::ServedFrom> for ServedFrom {
    fn from(s: vocab::ServedFrom) -> Self {
        match s {
            vocab::ServedFrom::Model => ServedFrom::Model,
            vocab::ServedFrom::Exact => ServedFrom::Exact,
            vocab::ServedFrom::Fact => ServedFrom::Fact,
            vocab::ServedFrom::Verified => ServedFrom::Verified,
            vocab::ServedFrom::Partial => ServedFrom::Partial,
            vocab::ServedFrom::Trust => ServedFrom::Trust,
            vocab::ServedFrom::Equivalent => ServedFrom::Equivalent,
            vocab::ServedFrom::Blend => ServedFrom::Blend,
        }
    }
}

impl TryFrom<ServedFrom> for vocab::ServedFrom {
    type Error = ServedFrom;

    fn try_from(s: ServedFrom) -> Result<Self, ServedFrom> {
        match s {
            ServedFrom::Model => Ok(vocab::ServedFrom::Model),
            ServedFrom::Exact => Ok(vocab::ServedFrom::Exact),
            ServedFrom::Fact => Ok(vocab::ServedFrom::Fact),
            ServedFrom::Verified => Ok(vocab::ServedFrom::Verified),
            ServedFrom::Partial => Ok(vocab::ServedFrom::Partial),
            ServedFrom::Trust => Ok(vocab::ServedFrom::Trust),
            ServedFrom::Equivalent => Ok(vocab::ServedFrom::Equivalent),
            ServedFrom::Blend => Ok(vocab::ServedFrom::Blend),
            ServedFrom::Unspecified => Err(s),
        }
    }
}

impl From<vocab::StopReason> for StopReason {
    fn from(s: vocab::StopReason) -> Self {
        match s {
            vocab::StopReason::Stop => StopReason::Stop,
            vocab::StopReason::Length => StopReason::Length,
            vocab::StopReason::ContextFull => StopReason::ContextFull,
            vocab::StopReason::Cancelled => StopReason::Cancelled,
        }
    }
}

impl TryFrom<StopReason> for vocab::StopReason {
    type Error = StopReason;

    fn try_from(s: StopReason) -> Result<Self, StopReason> {
        match s {
            StopReason::Stop => Ok(vocab::StopReason::Stop),
            StopReason::Length => Ok(vocab::StopReason::Length),
            StopReason::ContextFull => Ok(vocab::StopReason::ContextFull),
            StopReason::Cancelled => Ok(vocab::StopReason::Cancelled),
            StopReason::Unspecified => Err(s),
        }
    }
}

/// CACHE_MODE_UNSPECIFIED (an unset field) is AUTO.
impl From<CacheMode> for vocab::CacheMode {
    fn from(m: CacheMode) -> Self {
        match m {
            CacheMode::Unspecified | CacheMode::Auto => vocab::CacheMode::Auto,
            CacheMode::Bypass => vocab::CacheMode::Bypass,
            CacheMode::Refresh => vocab::CacheMode::Refresh,
            CacheMode::Verified => vocab::CacheMode::Verified,
            CacheMode::Trust => vocab::CacheMode::Trust,
            CacheMode::Exact => vocab::CacheMode::Exact,
            CacheMode::Equivalent => vocab::CacheMode::Equivalent,
            CacheMode::Blend => vocab::CacheMode::Blend,
        }
    }
}

impl From<vocab::CacheMode> for CacheMode {
    fn from(m: vocab::CacheMode) -> Self {
        match m {
            vocab::CacheMode::Auto => CacheMode::Auto,
            vocab::CacheMode::Bypass => CacheMode::Bypass,
            vocab::CacheMode::Refresh => CacheMode::Refresh,
            vocab::CacheMode::Verified => CacheMode::Verified,
            vocab::CacheMode::Trust => CacheMode::Trust,
            vocab::CacheMode::Exact => CacheMode::Exact,
            vocab::CacheMode::Equivalent => CacheMode::Equivalent,
            vocab::CacheMode::Blend => CacheMode::Blend,
        }
    }
}

impl From<pipeline::Outcome> for Outcome {
    fn from(o: pipeline::Outcome) -> Self {
        Outcome {
            served_from: ServedFrom::from(o.served_from) as i32,
            stop_reason: StopReason::from(o.stop_reason) as i32,
            inference_id: o.inference_id,
            source_inference_id: o.source_inference_id.unwrap_or_default(),
            source_fact_id: o.source_fact_id.unwrap_or_default(),
            similarity: o.similarity as f32,
            prompt_token_ids: o.prompt_token_ids,
            completion_tokens: o.completion_tokens as u32,
            tokens_computed: o.tokens_computed as u32,
            tokens_reused: o.tokens_reused as u32,
            queue_ms: o.queue_ms,
            prefill_ms: o.prefill_ms,
            decode_ms: o.decode_ms,
            latency_ms: o.latency_ms,
            peak_batch: o.peak_batch as u32,
            model: o.model,
            backend: o.backend,
            ttft_ms: o.ttft_ms.unwrap_or_default(),
            kv_tokens_reused: o.kv_tokens_reused as u32,
            draft_tokens: o.draft_tokens as u32,
            draft_tokens_accepted: o.draft_tokens_accepted as u32,
            candidates_tried: o.candidates_tried as u32,
            equivalence_mean_margin: o.equivalence.map_or(0.0, |e| e.mean_margin as f32),
            equivalence_worst_margin: o.equivalence.map_or(0.0, |e| e.worst_margin as f32),
            equivalence_checks: o.equivalence_checks as u32,
            blend_tokens_reused: o.blend_tokens_reused as u32,
            blend_tokens_recomputed: o.blend_tokens_recomputed as u32,
        }
    }
}

impl From<pipeline::Chunk> for GenerateResponse {
    fn from(c: pipeline::Chunk) -> Self {
        GenerateResponse { text: c.text, token_ids: c.token_ids, outcome: c.outcome.map(|o| Outcome::from(*o)) }
    }
}

impl From<GenerateRequest> for pipeline::Request {
    /// The request in the pipeline's words; `cache_mode` is checked by the caller
    /// ([`cache_mode`]).
    fn from(r: GenerateRequest) -> Self {
        pipeline::Request {
            cache_mode: CacheMode::try_from(r.cache_mode).map(vocab::CacheMode::from).unwrap_or_default(),
            prompt: r.prompt,
            messages: r.messages.into_iter().map(|m| pipeline::ChatMessage { role: m.role, content: m.content }).collect(),
            system: r.system,
            raw: r.raw,
            max_tokens: r.max_tokens,
            temperature: r.temperature,
            top_k: r.top_k,
            top_p: r.top_p,
            seed: r.seed,
            stop: r.stop,
            model: r.model,
            documents: r.documents,
            blend_recompute: None,
        }
    }
}

/// A request's cache mode, or the error for a number no `CacheMode` value has.
pub fn cache_mode(value: i32) -> Result<vocab::CacheMode, pipeline::ServiceError> {
    CacheMode::try_from(value)
        .map(vocab::CacheMode::from)
        .map_err(|_| pipeline::ServiceError::InvalidArgument(format!("unknown cache_mode {value}")))
}

impl From<store::Fact> for Fact {
    fn from(f: store::Fact) -> Self {
        Fact {
            id: f.id,
            content: f.content,
            question: f.question.unwrap_or_default(),
            confidence: f.confidence,
            source_type: f.source_type,
            created_at: f.created_at,
            provenance_inference_id: f.provenance_inference_id.unwrap_or_default(),
            reuse_count: f.reuse_count.max(0) as u64,
            live: f.live,
            degraded_by: f.degraded_by.unwrap_or_default(),
            degradation_reason: f.degradation_reason.unwrap_or_default(),
        }
    }
}

impl From<store::Stats> for GetStatsResponse {
    fn from(s: store::Stats) -> Self {
        GetStatsResponse {
            tenant: s.tenant,
            requests: s.requests,
            tiers: s
                .tiers
                .into_iter()
                .map(|t| TierStats {
                    served_from: ServedFrom::from(t.served_from) as i32,
                    requests: t.requests,
                    hit_rate: t.hit_rate,
                    tokens_computed: t.tokens_computed,
                    tokens_reused: t.tokens_reused,
                    latency_p50_ms: t.latency_p50_ms,
                    latency_p95_ms: t.latency_p95_ms,
                })
                .collect(),
            tokens_saved: s.tokens_saved,
            time_saved_ms: s.time_saved_ms,
            live_facts: s.live_facts,
            degraded_facts: s.degraded_facts,
            reasoning_chains: s.reasoning_chains,
        }
    }
}
