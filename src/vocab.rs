//! The shared vocabulary of every layer: why generation stopped, how a request may use the
//! caches, and which tier served it. Defined once here, on the ground floor, so the engine, the
//! store, the caches, the pipeline and both front ends (gRPC and HTTP) speak the same words
//! without importing from each other. The wire forms (proto enums, OpenAI's `finish_reason`)
//! are mapped at the front ends; the text forms here are what the store writes.

use serde::Serialize;

/// Why generation of an answer stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token (end of turn / end of text) or a stop string.
    Stop,
    /// The max_tokens budget.
    Length,
    /// The KV cache (context) is full.
    ContextFull,
    /// The caller's callback asked to stop (client went away).
    Cancelled,
}

impl StopReason {
    pub const ALL: [StopReason; 4] = [StopReason::Stop, StopReason::Length, StopReason::ContextFull, StopReason::Cancelled];

    /// The store's text (`inferences.stop_reason`): `stop`, `length`, `context_full`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Stop => "stop",
            StopReason::Length => "length",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<StopReason> {
        StopReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// How a request may use the caches (stored in `inferences.cache_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// Facts, the exact cache, then verified semantic reuse (the default).
    #[default]
    Auto,
    /// Compute everything; read and write no cache (the request is still recorded).
    Bypass,
    /// Compute, then replace the cached answer.
    Refresh,
    /// Like AUTO (the name says what it does).
    Verified,
    /// Serve a neighbour's answer without the model when the learned decision allows it.
    Trust,
    /// Facts and the exact cache only; no semantic reuse.
    Exact,
    /// Opt-in: a neighbour's answer that the model, scoring it under the new prompt in one
    /// teacher-forced pass, finds as acceptable as for its own question is served without
    /// decoding, when the learned region bounds the error rate; else VERIFIED.
    Equivalent,
    /// Opt-in and lossy: the request's documents reuse KV computed for them at other positions
    /// (re-rotated, a fraction of their tokens recomputed: CacheBlend); no answer cache is read
    /// or written, and the answer may differ from the uncached one.
    Blend,
}

impl CacheMode {
    pub const ALL: [CacheMode; 8] = [
        CacheMode::Auto,
        CacheMode::Bypass,
        CacheMode::Refresh,
        CacheMode::Verified,
        CacheMode::Trust,
        CacheMode::Exact,
        CacheMode::Equivalent,
        CacheMode::Blend,
    ];

    /// The store's text: `auto`, `bypass`, `refresh`, `verified`, `trust`, `exact`, `equivalent`,
    /// `blend`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Auto => "auto",
            CacheMode::Bypass => "bypass",
            CacheMode::Refresh => "refresh",
            CacheMode::Verified => "verified",
            CacheMode::Trust => "trust",
            CacheMode::Exact => "exact",
            CacheMode::Equivalent => "equivalent",
            CacheMode::Blend => "blend",
        }
    }

    /// The text form, any case (`EXACT`, `exact`).
    pub fn parse(s: &str) -> Option<CacheMode> {
        CacheMode::ALL.into_iter().find(|m| m.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// Where an answer came from (stored in `inferences.served_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServedFrom {
    /// The model computed the answer.
    Model,
    /// An earlier identical request's answer.
    Exact,
    /// A live user-provided fact filed under the question.
    Fact,
    /// A neighbour's whole answer, checked by the model token by token.
    Verified,
    /// A checked prefix of a neighbour's answer, the rest decoded.
    Partial,
    /// A neighbour's answer served without running the model.
    Trust,
    /// A neighbour's answer that the model scored (one teacher-forced pass, no decoding) as
    /// acceptable for this question (cache mode EQUIVALENT).
    Equivalent,
    /// The model computed the answer over document KV reused at other positions (cache mode
    /// BLEND: lossy).
    Blend,
}

impl ServedFrom {
    pub const ALL: [ServedFrom; 8] = [
        ServedFrom::Model,
        ServedFrom::Exact,
        ServedFrom::Fact,
        ServedFrom::Verified,
        ServedFrom::Partial,
        ServedFrom::Trust,
        ServedFrom::Equivalent,
        ServedFrom::Blend,
    ];

    /// The store's text: `MODEL`, `EXACT`, `FACT`, `VERIFIED`, `PARTIAL`, `TRUST`, `EQUIVALENT`,
    /// `BLEND`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServedFrom::Model => "MODEL",
            ServedFrom::Exact => "EXACT",
            ServedFrom::Fact => "FACT",
            ServedFrom::Verified => "VERIFIED",
            ServedFrom::Partial => "PARTIAL",
            ServedFrom::Trust => "TRUST",
            ServedFrom::Equivalent => "EQUIVALENT",
            ServedFrom::Blend => "BLEND",
        }
    }

    pub fn parse(s: &str) -> Option<ServedFrom> {
        ServedFrom::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Whether the model ran for this answer (MODEL, VERIFIED, PARTIAL, BLEND).
    pub fn computed(self) -> bool {
        matches!(self, ServedFrom::Model | ServedFrom::Verified | ServedFrom::Partial | ServedFrom::Blend)
    }
}

impl std::fmt::Display for ServedFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip() {
        for s in StopReason::ALL {
            assert_eq!(StopReason::parse(s.as_str()), Some(s));
        }
        for m in CacheMode::ALL {
            assert_eq!(CacheMode::parse(m.as_str()), Some(m));
            assert_eq!(CacheMode::parse(&m.as_str().to_ascii_uppercase()), Some(m));
        }
        for t in ServedFrom::ALL {
            assert_eq!(ServedFrom::parse(t.as_str()), Some(t));
        }
        assert_eq!(CacheMode::parse("sometimes"), None);
        assert_eq!(serde_json::to_string(&StopReason::ContextFull).expect("json"), "\"context_full\"");
        assert_eq!(serde_json::to_string(&ServedFrom::Exact).expect("json"), "\"EXACT\"");
    }
}
