//! The generated gRPC code for `proto/forge/v1/forge.proto` (tonic + prost), its encoded file
//! descriptor set (served by reflection), and conversions between its enums and the library's.

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("forge.v1");

/// The encoded `FileDescriptorSet` of forge.proto, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("forge_descriptor");

use crate::engine::generate::StopReason as EngineStop;
use crate::store;

impl From<store::ServedFrom> for ServedFrom {
    fn from(s: store::ServedFrom) -> Self {
        match s {
            store::ServedFrom::Model => ServedFrom::Model,
            store::ServedFrom::Exact => ServedFrom::Exact,
            store::ServedFrom::Fact => ServedFrom::Fact,
            store::ServedFrom::Verified => ServedFrom::Verified,
            store::ServedFrom::Partial => ServedFrom::Partial,
            store::ServedFrom::Trust => ServedFrom::Trust,
        }
    }
}

impl From<EngineStop> for StopReason {
    fn from(s: EngineStop) -> Self {
        match s {
            EngineStop::Stop => StopReason::Stop,
            EngineStop::Length => StopReason::Length,
            EngineStop::ContextFull => StopReason::ContextFull,
            EngineStop::Cancelled => StopReason::Cancelled,
        }
    }
}

impl TryFrom<StopReason> for EngineStop {
    type Error = StopReason;

    fn try_from(s: StopReason) -> Result<Self, StopReason> {
        match s {
            StopReason::Stop => Ok(EngineStop::Stop),
            StopReason::Length => Ok(EngineStop::Length),
            StopReason::ContextFull => Ok(EngineStop::ContextFull),
            StopReason::Cancelled => Ok(EngineStop::Cancelled),
            StopReason::Unspecified => Err(s),
        }
    }
}

impl From<CacheMode> for store::CacheMode {
    fn from(m: CacheMode) -> Self {
        match m {
            CacheMode::Auto => store::CacheMode::Auto,
            CacheMode::Bypass => store::CacheMode::Bypass,
            CacheMode::Refresh => store::CacheMode::Refresh,
            CacheMode::Verified => store::CacheMode::Verified,
            CacheMode::Trust => store::CacheMode::Trust,
            CacheMode::Exact => store::CacheMode::Exact,
        }
    }
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
