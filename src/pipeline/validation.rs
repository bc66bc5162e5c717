//! Validation, the pipeline's first stage: every field of a [`Request`] is checked, the prompt is
//! rendered with the model's chat template, and what the later stages need is derived once
//! (exact-cache key, semantic scope, whether KV blocks may be reused, the parameters recorded).
//! The result is a [`Plan`]; nothing after this stage looks at the request again. Errors are
//! `INVALID_ARGUMENT` (or NOT_FOUND for another model) with a message saying what to change.
//!
//! Its second half, [`Pipeline::tokenize`], runs only when an answer needs the prompt's tokens:
//! the exact key is made of the rendered text, so FACT and EXACT look up before it, and an
//! EXACT hit whose row kept its prompt's ids is answered without the tokenizer (which a
//! restarted service is still building).

use std::time::Instant;

use super::error::{invalid, quoted, ServiceError};
use super::request::Request;
use super::Pipeline;
use crate::cache::semantic;
use crate::cache::{exact_key, KeyParts};
use crate::engine::chat::Message;
use crate::engine::generate::{GenerateError, GenerateParams};
use crate::engine::sampler::SamplingParams;
use crate::engine::tokenizer::Tokenizer;
use crate::store::semantic::Neighbour;
use crate::store::sha256_hex;
use crate::vocab::CacheMode;

/// Stands for the question when a prompt is rendered to find its semantic scope.
const QUESTION_PLACEHOLDER: &str = "\u{1}question\u{1}";

/// Stands for the documents in the rendered prompt until they are tokenized as chunks.
const DOCUMENTS_PLACEHOLDER: &str = "\u{1}documents\u{1}";

/// At most this many documents per request, each at most [`MAX_DOCUMENT_BYTES`].
pub const MAX_DOCUMENTS: usize = 16;
pub const MAX_DOCUMENT_BYTES: usize = 32 * 1024;

/// At most this many stop strings, each at most [`MAX_STOP_BYTES`].
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 256;

/// An EQUIVALENT candidate the model scored for this request.
#[derive(Debug, Clone)]
pub(crate) struct EquivalenceCheck {
    /// The candidate's row in `inferences`.
    pub(crate) source: i64,
    /// Cosine similarity of its question to this request's.
    pub(crate) similarity: f64,
    /// The candidate's tokens as the model would emit them (the stop token included).
    pub(crate) tokens: Vec<u32>,
    /// The model's score of the candidate.
    pub(crate) score: crate::cache::equivalent::Score,
}

/// A validated request: what the tiers, the engine and the recording need.
#[derive(Clone)]
pub struct Plan {
    /// The request's id in logs and traces.
    pub(crate) request_id: u64,
    /// The tenant the request runs for.
    pub(crate) tenant: String,
    /// The user's question when the request is one (facts are filed under it).
    pub(crate) question: Option<String>,
    /// The rendered prompt.
    pub(crate) prompt: String,
    /// sha256 (hex) of `prompt`.
    pub(crate) prompt_hash: String,
    /// The prompt's token ids: empty until [`Pipeline::tokenize`] (or an EXACT hit's recorded
    /// ids) fills them.
    pub(crate) prompt_ids: Vec<u32>,
    /// [`Pipeline::tokenize`] has run (`params.stop_ids` is set).
    pub(crate) tokenized: bool,
    /// What the engine generates with (max_tokens, sampling, stop ids).
    pub(crate) params: GenerateParams,
    /// Generation stops before the first of these strings.
    pub(crate) stop_strings: Vec<String>,
    /// The generation parameters as recorded (`inferences.params`).
    pub(crate) params_json: String,
    /// The cache mode the request runs with (BYPASS when the server runs without caches).
    pub(crate) mode: CacheMode,
    /// `None`: this request may not use the exact cache.
    pub(crate) cache_key: Option<String>,
    /// When the request arrived (latencies are measured from it).
    pub(crate) received: Instant,
    /// Semantic scope (single-question chat requests that may use caches): only questions in the
    /// same scope are neighbours.
    pub(crate) scope: Option<String>,
    /// The question's embedding, once computed.
    pub(crate) embedding: Option<Vec<f32>>,
    /// The nearest earlier answer, when one was offered as a draft (TRUST learns from it).
    pub(crate) top: Option<Neighbour>,
    /// The nearest earlier answer and the drafts the draft gate skipped for this (greedy)
    /// request: replayed on its answer afterwards, so skipping still teaches the gate and TRUST.
    pub(crate) skipped: Option<(Neighbour, Vec<crate::engine::scheduler::Draft>)>,
    /// The semantic tier was skipped altogether (the draft gate skips drafts at every
    /// similarity and this request does not explore, `cache::skip`): no embedding, nothing
    /// filed, no answer log-probabilities.
    pub(crate) lookup_skipped: bool,
    /// EQUIVALENT: the best scored candidate, when one was scored and not served (its fresh
    /// answer tells whether it was acceptable).
    pub(crate) equivalence: Option<EquivalenceCheck>,
    /// Candidates scored by EQUIVALENT.
    pub(crate) equivalence_checks: usize,
    /// EQUIVALENT: what the check's prefix cache reused and computed (the prompt's blocks it
    /// published are stored with this request's own, when it is recorded).
    pub(crate) check_kv: Option<crate::workload::ReportData>,
    /// Whether the request may reuse and store KV blocks (not BYPASS, reuse configured).
    pub(crate) kv_reuse: bool,
    /// The documents' token spans in `prompt_ids`: (start, length), in order.
    pub(crate) chunks: Vec<(usize, usize)>,
    /// BLEND: the fraction of document tokens recomputed.
    pub(crate) blend_recompute: f32,
}

/// A rendered prompt: its text and, when it holds documents, its token ids (tokenized piece by
/// piece) and where the documents' tokens are.
struct Rendered {
    text: String,
    ids: Option<Vec<u32>>,
    chunks: Vec<(usize, usize)>,
}

impl Pipeline {
    /// Checks every field, renders the prompt, derives the cache key (tokenizing is
    /// [`Pipeline::tokenize`]). Blocking (rendering runs the chat template).
    pub(crate) fn validate(&self, request_id: u64, tenant: String, req: &Request, received: Instant) -> Result<Plan, ServiceError> {
        if !req.model.is_empty() && req.model != self.model_name && req.model != self.model_id {
            return Err(ServiceError::UnknownModel { requested: req.model.clone(), served: self.model_name.clone(), id: self.model_id.clone() });
        }
        let mode = match req.cache_mode {
            _ if !self.cache_enabled => CacheMode::Bypass,
            CacheMode::Auto => self.tenant_modes.get(&tenant).copied().unwrap_or(CacheMode::Auto),
            m => m,
        };
        if mode == CacheMode::Blend && self.kv.is_none() {
            return Err(invalid("cache mode BLEND reuses stored KV: this server runs without KV reuse (--no-kv-reuse)"));
        }
        let blend_recompute = match req.blend_recompute {
            Some(r) if !(0.0..=1.0).contains(&r) => return Err(invalid(format!("blend_recompute {r} is not in 0 ..= 1"))),
            Some(r) => r,
            None => self.blend_recompute,
        };
        let (rendered, question, around) = self.render(req)?;
        let Rendered { text: prompt, ids: document_ids, chunks } = rendered;
        let max_tokens = match req.max_tokens {
            None => self.default_max_tokens.min(self.context),
            Some(0) => return Err(invalid("max_tokens must be at least 1")),
            Some(n) if n as usize > self.context => {
                return Err(invalid(format!("max_tokens {n} exceeds the model's context of {} tokens", self.context)))
            }
            Some(n) => n as usize,
        };
        let sampling = SamplingParams {
            temperature: req.temperature.unwrap_or(0.0),
            top_k: req.top_k as usize,
            top_p: req.top_p.unwrap_or(1.0),
            seed: req.seed,
        };
        sampling.validate().map_err(|e| invalid(e.to_string()))?;
        if req.stop.len() > MAX_STOPS || req.stop.iter().any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES) {
            return Err(invalid(format!("stop takes at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_BYTES} bytes")));
        }
        let cache_key = match mode {
            CacheMode::Bypass | CacheMode::Blend => None,
            CacheMode::Auto | CacheMode::Refresh | CacheMode::Verified | CacheMode::Trust | CacheMode::Exact | CacheMode::Equivalent => exact_key(&KeyParts {
                tenant: &tenant,
                model_id: &self.model_id,
                prompt: &prompt,
                max_tokens,
                sampling,
                stop: &req.stop,
            }),
        };
        let scope = match (mode, &around, &self.semantic) {
            (CacheMode::Bypass | CacheMode::Blend, _, _) | (_, None, _) | (_, _, None) => None,
            (_, Some(around), Some(_)) => Some(semantic::scope(&tenant, &self.model_id, around)),
        };
        let params_json = serde_json::json!({
            "max_tokens": max_tokens, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "seed": sampling.seed, "stop": req.stop, "raw": req.raw,
        })
        .to_string();
        let kv_reuse = self.kv.is_some() && mode != CacheMode::Bypass;
        let mut plan = Plan {
            request_id,
            kv_reuse,
            tenant,
            question,
            prompt_hash: sha256_hex(prompt.as_bytes()),
            prompt,
            prompt_ids: Vec::new(),
            tokenized: false,
            params: GenerateParams { max_tokens, sampling, stop_ids: Vec::new() },
            stop_strings: req.stop.clone(),
            params_json,
            mode,
            cache_key,
            received,
            scope,
            embedding: None,
            top: None,
            skipped: None,
            lookup_skipped: false,
            equivalence: None,
            equivalence_checks: 0,
            check_kv: None,
            chunks,
            blend_recompute,
        };
        if let Some(ids) = document_ids {
            // Tokenized piece by piece by render (the documents' spans).
            self.set_tokens(&mut plan, ids, self.tokenizer()?)?;
        }
        Ok(plan)
    }

    /// Validation's second half, for a request whose answer needs the prompt's tokens (all but
    /// an EXACT hit whose row kept them): tokenizes the rendered prompt — waiting for the
    /// tokenizer while a restarted service is still building it — checks the length against the
    /// context, sets the stop tokens. Runs once per plan. Blocking (a long prompt takes a while).
    pub(crate) fn tokenize(&self, plan: &mut Plan) -> Result<(), ServiceError> {
        if plan.tokenized {
            return Ok(());
        }
        let tokenizer = self.tokenizer()?;
        let t = Instant::now();
        let ids = tokenizer.encode_prompt(&plan.prompt).map_err(|e| invalid(format!("cannot tokenize the prompt: {e}")))?;
        self.metrics.stage("tokenize", t.elapsed());
        self.set_tokens(plan, ids, tokenizer)
    }

    /// The plan's prompt ids (checked against the context) and stop tokens: it is tokenized.
    fn set_tokens(&self, plan: &mut Plan, ids: Vec<u32>, tokenizer: &Tokenizer) -> Result<(), ServiceError> {
        self.set_prompt_ids(plan, ids)?;
        plan.params.stop_ids = tokenizer.stop_ids().to_vec();
        plan.tokenized = true;
        Ok(())
    }

    /// The prompt's token ids (tokenized now, or recorded with an earlier answer to the same
    /// rendered prompt), checked against the model's context as every prompt is.
    pub(crate) fn set_prompt_ids(&self, plan: &mut Plan, ids: Vec<u32>) -> Result<(), ServiceError> {
        if ids.len() >= self.context {
            return Err(invalid(GenerateError::PromptTooLong { prompt: ids.len(), context: self.context }.to_string()));
        }
        plan.prompt_ids = ids;
        Ok(())
    }

    /// The prompt the model sees (text; with documents also its ids and the documents' spans),
    /// the question when the request is a single question without documents, and then the prompt
    /// rendered with a placeholder in the question's place.
    fn render(&self, req: &Request) -> Result<(Rendered, Option<String>, Option<String>), ServiceError> {
        if req.documents.is_empty() {
            let (text, question, around) = self.render_text(req)?;
            return Ok((Rendered { text, ids: None, chunks: Vec::new() }, question, around));
        }
        if req.documents.len() > MAX_DOCUMENTS {
            return Err(invalid(format!("{} documents: at most {MAX_DOCUMENTS} per request", req.documents.len())));
        }
        for (i, d) in req.documents.iter().enumerate() {
            if d.trim().is_empty() || d.len() > MAX_DOCUMENT_BYTES || d.contains(DOCUMENTS_PLACEHOLDER) {
                return Err(invalid(format!("document {} must be non-empty text of at most {MAX_DOCUMENT_BYTES} bytes", i + 1)));
            }
        }
        if req.raw {
            return Err(invalid("documents go into the chat template's user message: not with raw"));
        }
        if self.template.is_none() {
            return Err(invalid("this model has no chat template: documents need one"));
        }
        // The documents at the start of the last user message, each tokenized on its own (its
        // tokens the same wherever it goes), control tokens in them left as plain text.
        let mut marked = req.clone();
        marked.documents.clear();
        if marked.messages.is_empty() {
            marked.prompt.insert_str(0, DOCUMENTS_PLACEHOLDER);
        } else {
            match marked.messages.iter_mut().rev().find(|m| m.role == "user") {
                Some(m) => m.content.insert_str(0, DOCUMENTS_PLACEHOLDER),
                None => return Err(invalid("documents go into a user message: the request has none")),
            }
        }
        let (text, _, _) = self.render_text(&marked)?;
        let Some((before, after)) = text.split_once(DOCUMENTS_PLACEHOLDER) else {
            return Err(invalid("the chat template dropped the user message that holds the documents"));
        };
        let tok = |e: crate::engine::tokenizer::TokenizerError| invalid(format!("cannot tokenize the prompt: {e}"));
        // Documents need their own tokens now (the chunks' spans): wait for the tokenizer.
        let tokenizer = self.tokenizer()?;
        let mut ids = tokenizer.encode_prompt(before).map_err(tok)?;
        let mut full = before.to_string();
        let mut chunks = Vec::with_capacity(req.documents.len());
        for d in &req.documents {
            let piece = format!("{}\n\n", d.trim());
            let t = tokenizer.encode(&piece, false).map_err(tok)?;
            chunks.push((ids.len(), t.len()));
            ids.extend(t);
            full.push_str(&piece);
        }
        ids.extend(tokenizer.encode(after, true).map_err(tok)?);
        full.push_str(after);
        if chunks.first().is_some_and(|c| c.0 == 0) {
            return Err(invalid("the chat template puts the documents first: BLEND needs a token before them"));
        }
        Ok((Rendered { text: full, ids: Some(ids), chunks }, None, None))
    }

    /// The prompt text, the question and the masked prompt (see [`Pipeline::render`]).
    fn render_text(&self, req: &Request) -> Result<(String, Option<String>, Option<String>), ServiceError> {
        match (req.prompt.is_empty(), req.messages.is_empty()) {
            (false, false) => return Err(invalid("give either prompt or messages, not both")),
            (true, true) => return Err(invalid("the prompt is empty")),
            _ => {}
        }
        if !req.prompt.is_empty() && req.prompt.trim().is_empty() {
            return Err(invalid("the prompt is empty (only whitespace)"));
        }
        if req.raw {
            if !req.messages.is_empty() || !req.system.is_empty() {
                return Err(invalid("raw takes a prompt only (no messages, no system)"));
            }
            return Ok((req.prompt.clone(), None, None));
        }
        let messages: Vec<Message> = if req.messages.is_empty() {
            let system = (!req.system.is_empty()).then(|| Message::system(req.system.clone()));
            system.into_iter().chain([Message::user(req.prompt.clone())]).collect()
        } else {
            if !req.system.is_empty() {
                return Err(invalid("with messages, send the system message as the first message"));
            }
            for m in &req.messages {
                if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
                    return Err(invalid(format!("message role {} is not system, user or assistant", quoted(&m.role))));
                }
            }
            if req.messages.iter().all(|m| m.content.trim().is_empty()) {
                return Err(invalid("the prompt is empty (every message is empty)"));
            }
            req.messages.iter().map(|m| Message::new(m.role.clone(), m.content.clone())).collect()
        };
        let users: Vec<&Message> = messages.iter().filter(|m| m.role == "user").collect();
        let question = match users.as_slice() {
            [one] if !messages.iter().any(|m| m.role == "assistant") => Some(one.content.clone()),
            _ => None,
        };
        let Some(template) = &self.template else {
            return match (req.messages.is_empty(), req.system.is_empty()) {
                (true, true) => Ok((req.prompt.clone(), question, None)),
                _ => Err(invalid("this model has no chat template: send a raw prompt")),
            };
        };
        let text = template.render(&messages, true).map_err(|e| invalid(e.to_string()))?;
        let around = match &question {
            Some(_) => {
                let masked: Vec<Message> = messages
                    .iter()
                    .map(|m| if m.role == "user" { Message::new(m.role.clone(), QUESTION_PLACEHOLDER.to_string()) } else { m.clone() })
                    .collect();
                Some(template.render(&masked, true).map_err(|e| invalid(e.to_string()))?)
            }
            None => None,
        };
        Ok((text, question, around))
    }
}
