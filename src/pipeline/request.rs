//! What goes into the pipeline and what comes out, in words of no front end: the gRPC service
//! and the HTTP API each translate their own messages into a [`Request`] and a [`Chunk`] stream
//! back into theirs.

use std::pin::Pin;

use tokio_stream::Stream;

use super::error::ServiceError;
use crate::vocab::{CacheMode, ServedFrom, StopReason};

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (anything else is refused by validation).
    pub role: String,
    /// Text of the message.
    pub content: String,
}

/// A generation request. Exactly one of `prompt` and `messages` must be non-empty.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// A user message, wrapped in the model's chat template (or sent as is with `raw`).
    pub prompt: String,
    /// A whole conversation, rendered with the model's chat template.
    pub messages: Vec<ChatMessage>,
    /// System message put before `prompt` (chat template only).
    pub system: String,
    /// Tokenize `prompt` as given (special tokens parsed), no chat template.
    pub raw: bool,
    /// `None`: the server's default. Must be 1 ..= the model's context.
    pub max_tokens: Option<u32>,
    /// `None` or 0: greedy. Must be >= 0.
    pub temperature: Option<f32>,
    /// 0: no top-k cut.
    pub top_k: u32,
    /// `None`: 1.0. Must be in (0, 1].
    pub top_p: Option<f32>,
    /// Same seed, same answer.
    pub seed: Option<u64>,
    /// Generation stops before the first of these strings.
    pub stop: Vec<String>,
    /// How the request may use the caches (default AUTO).
    pub cache_mode: CacheMode,
    /// The served model's name or id; empty = the served model.
    pub model: String,
    /// Documents the answer may draw on, put at the start of the (last) user message, each as
    /// its own chunk of tokens (cache mode BLEND reuses a chunk's KV wherever it recurs).
    pub documents: Vec<String>,
    /// BLEND: the fraction of document tokens to recompute (0 ..= 1); `None`: the server's.
    /// Not on the wire: for benchmarks in the process.
    pub blend_recompute: Option<f32>,
}

/// Where an answer came from and what it cost: the last piece of every answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The tier that served the answer (or MODEL, VERIFIED, PARTIAL when computed).
    pub served_from: ServedFrom,
    /// Why the answer ended.
    pub stop_reason: StopReason,
    /// The cache mode the request ran with (BYPASS when the server runs without caches).
    pub cache_mode: CacheMode,
    /// This request's row in `inferences`.
    pub inference_id: i64,
    /// The inference the answer came from (EXACT, TRUST, VERIFIED, PARTIAL).
    pub source_inference_id: Option<i64>,
    /// The fact the answer came from (FACT).
    pub source_fact_id: Option<i64>,
    /// 1 for EXACT and FACT, the neighbour's similarity for the semantic tiers, 0 when computed.
    pub similarity: f64,
    /// The prompt as the model sees it.
    pub prompt_token_ids: Vec<u32>,
    /// Tokens of the answer.
    pub completion_tokens: usize,
    /// Positions the model computed for this request; 0 when served from a cache.
    pub tokens_computed: usize,
    /// Tokens whose computation was reused instead of redone.
    pub tokens_reused: usize,
    /// Prompt tokens whose KV came from stored blocks.
    pub kv_tokens_reused: usize,
    /// BLEND: document tokens that kept KV computed elsewhere, and those recomputed.
    pub blend_tokens_reused: usize,
    /// (see `blend_tokens_reused`)
    pub blend_tokens_recomputed: usize,
    /// Submit to admission in the engine, ms (0 for a cache tier).
    pub queue_ms: f64,
    /// Admission to the first token, ms (EQUIVALENT: the check's time; 0 for other cache tiers).
    pub prefill_ms: f64,
    /// First token to the end, ms (0 for a cache tier).
    pub decode_ms: f64,
    /// Received to the outcome, as the server measures it.
    pub latency_ms: f64,
    /// Received to the first token (`None`: no token).
    pub ttft_ms: Option<f64>,
    /// The most sequences that shared a forward pass with this request.
    pub peak_batch: usize,
    /// The served model's name (its file name without `.gguf`).
    pub model: String,
    /// Where the model's layers run (`Model::placement`).
    pub backend: String,
    /// Draft tokens offered to the model, and those it agreed with.
    pub draft_tokens: usize,
    /// (see `draft_tokens`)
    pub draft_tokens_accepted: usize,
    /// Neighbours whose answers were tried as drafts.
    pub candidates_tried: usize,
    /// EQUIVALENT: the score of the served candidate (or of the best one, when none was served).
    pub equivalence: Option<crate::cache::equivalent::Score>,
    /// Candidate answers EQUIVALENT scored for this request.
    pub equivalence_checks: usize,
}

impl Outcome {
    /// Prompt tokens the request did not compute: all of them when a cache tier served the
    /// answer, else those whose KV came from stored blocks.
    pub fn cached_prompt_tokens(&self) -> usize {
        if self.served_from.computed() {
            self.kv_tokens_reused
        } else {
            self.prompt_token_ids.len()
        }
    }
}

/// A piece of an answer: text (and the token ids behind it) in order; the last piece carries
/// the outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    /// Text produced since the previous piece.
    pub text: String,
    /// Token ids behind `text`.
    pub token_ids: Vec<u32>,
    /// Only on the last piece.
    pub outcome: Option<Box<Outcome>>,
}

pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<Chunk, ServiceError>> + Send>>;

/// An answer on its way: known before the first piece, then the pieces.
pub struct Generation {
    /// The request's id in logs and traces (not the `inferences` row, which the outcome carries).
    pub request_id: u64,
    /// The cache mode the request runs with.
    pub cache_mode: CacheMode,
    /// The tier, when a cache serves the answer (known at once); `None` while the engine
    /// computes it (the outcome then says MODEL, VERIFIED or PARTIAL).
    pub served_from: Option<ServedFrom>,
    /// The pieces of the answer; the last carries the outcome.
    pub chunks: ChunkStream,
}
