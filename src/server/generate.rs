//! `Generate`: validate and render the request into a [`Plan`], then serve it from the first
//! tier that can:
//!
//! 1. FACT — (AUTO, single-question requests) a live user-provided fact filed under the question;
//! 2. EXACT — (AUTO, cacheable requests) the recorded answer to the same key;
//! 3. MODEL — the engine, streaming token by token.
//!
//! Every request is recorded in `inferences` before its last message is sent (that message's
//! outcome carries the row id). A computed answer (not BYPASS) then leaves its claims in the
//! fact store and, when cacheable, becomes the exact cache's answer for its key (REFRESH
//! supersedes the previous one). A client that goes away cancels the sequence; the partial
//! answer is recorded as `cancelled` and never served from a cache.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::Status;

use super::error::ServiceError;
use super::proto::{self, GenerateRequest, GenerateResponse, Outcome};
use super::ForgeState;
use crate::cache::semantic::{self, draft_of, fits_budget};
use crate::cache::{exact_key, KeyParts};
use crate::engine::scheduler::Draft;
use crate::store::semantic::{Neighbour, Outcome as SemanticOutcome};
use crate::engine::chat::Message;
use crate::engine::generate::{GenerateError, GenerateParams, StopReason};
use crate::engine::sampler::SamplingParams;
use crate::engine::scheduler::{Event, Job};
use crate::store::{sha256_hex, CacheMode, CachedAnswer, NewInference, ServedFrom};
use crate::workload::{BlockKey, KvPlan, KvReport};

pub type GenerateStream = Pin<Box<dyn Stream<Item = Result<GenerateResponse, Status>> + Send>>;

/// Stands for the question when a prompt is rendered to find its semantic scope.
const QUESTION_PLACEHOLDER: &str = "\u{1}question\u{1}";

/// At most this many stop strings, each at most [`MAX_STOP_BYTES`].
const MAX_STOPS: usize = 16;
const MAX_STOP_BYTES: usize = 256;
/// Messages buffered towards a slow client before generation waits for it.
const STREAM_BUFFER: usize = 64;

/// A validated request.
pub(crate) struct Plan {
    tenant: String,
    /// The user's question when the request is one (facts are filed under it).
    question: Option<String>,
    /// The rendered prompt and its token ids.
    prompt: String,
    prompt_hash: String,
    prompt_ids: Vec<u32>,
    params: GenerateParams,
    stop_strings: Vec<String>,
    params_json: String,
    mode: CacheMode,
    /// `None`: this request may not use the exact cache.
    cache_key: Option<String>,
    received: Instant,
    /// Semantic scope (single-question chat requests that may use caches): only questions in the
    /// same scope are neighbours.
    scope: Option<String>,
    /// The question's embedding, once computed.
    embedding: Option<Vec<f32>>,
    /// The nearest earlier answer, when one was offered as a draft (TRUST learns from it).
    top: Option<Neighbour>,
    /// Keys of the prompt's KV blocks (`None`: no KV reuse, e.g. BYPASS).
    kv_keys: Option<Vec<BlockKey>>,
    /// What KV reuse did for this request (set when it goes to the engine).
    kv: Option<Arc<KvReport>>,
}

/// Where an answer came from and what it cost.
struct Answer {
    from: ServedFrom,
    text: String,
    tokens: Vec<u32>,
    stop: StopReason,
    source_inference_id: Option<i64>,
    source_fact_id: Option<i64>,
    tokens_computed: usize,
    tokens_reused: usize,
    queue: Duration,
    prefill: Duration,
    decode: Duration,
    peak_batch: usize,
    /// Received to first token (`None`: no token).
    ttft: Option<Duration>,
    /// Prompt tokens whose KV came from stored blocks.
    kv_tokens_reused: usize,
    /// Draft tokens offered / accepted, and the neighbours tried.
    draft_tokens: usize,
    draft_accepted: usize,
    candidates_tried: usize,
    /// Similarity of the neighbour the answer came from (semantic tiers).
    similarity: Option<f64>,
}

impl Answer {
    fn stored(from: ServedFrom, text: String, tokens: Vec<u32>, stop: StopReason, tokens_reused: usize) -> Answer {
        Answer {
            from,
            text,
            tokens,
            stop,
            source_inference_id: None,
            source_fact_id: None,
            tokens_computed: 0,
            tokens_reused,
            queue: Duration::ZERO,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            peak_batch: 0,
            ttft: None,
            kv_tokens_reused: 0,
            draft_tokens: 0,
            draft_accepted: 0,
            candidates_tried: 0,
            similarity: None,
        }
    }
}

fn invalid(msg: impl Into<String>) -> ServiceError {
    ServiceError::InvalidArgument(msg.into())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl ForgeState {
    /// Checks every field, renders and tokenizes the prompt, derives the cache key.
    fn plan(&self, tenant: String, req: &GenerateRequest, received: Instant) -> Result<Plan, ServiceError> {
        if !req.model.is_empty() && req.model != self.model_name && req.model != self.model_id {
            return Err(ServiceError::UnknownModel { requested: req.model.clone(), served: self.model_name.clone(), id: self.model_id.clone() });
        }
        let mode = proto::CacheMode::try_from(req.cache_mode).map_err(|_| invalid(format!("unknown cache_mode {}", req.cache_mode)))?;
        let mode = if self.cache_enabled { CacheMode::from(mode) } else { CacheMode::Bypass };
        let (prompt, question, around) = self.render(req)?;
        let prompt_ids = self.tokenizer.encode_prompt(&prompt).map_err(|e| invalid(format!("cannot tokenize the prompt: {e}")))?;
        if prompt_ids.len() >= self.context {
            return Err(invalid(GenerateError::PromptTooLong { prompt: prompt_ids.len(), context: self.context }.to_string()));
        }
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
            CacheMode::Bypass => None,
            CacheMode::Auto | CacheMode::Refresh | CacheMode::Verified | CacheMode::Trust | CacheMode::Exact => exact_key(&KeyParts {
                tenant: &tenant,
                model_id: &self.model_id,
                prompt: &prompt,
                max_tokens,
                sampling,
                stop: &req.stop,
            }),
        };
        let scope = match (mode, &around, &self.semantic) {
            (CacheMode::Bypass, _, _) | (_, None, _) | (_, _, None) => None,
            (_, Some(around), Some(_)) => Some(semantic::scope(&tenant, &self.model_id, around)),
        };
        let params_json = serde_json::json!({
            "max_tokens": max_tokens, "temperature": sampling.temperature, "top_k": sampling.top_k,
            "top_p": sampling.top_p, "seed": sampling.seed, "stop": req.stop, "raw": req.raw,
        })
        .to_string();
        let kv_keys = match (&self.kv, mode) {
            (Some(kv), m) if m != CacheMode::Bypass => Some(kv.seed(&tenant).keys(&prompt_ids)),
            _ => None,
        };
        Ok(Plan {
            kv_keys,
            kv: None,
            tenant,
            question,
            prompt_hash: sha256_hex(prompt.as_bytes()),
            prompt,
            prompt_ids,
            params: GenerateParams { max_tokens, sampling, stop_ids: self.tokenizer.stop_ids().to_vec() },
            stop_strings: req.stop.clone(),
            params_json,
            mode,
            cache_key,
            received,
            scope,
            embedding: None,
            top: None,
        })
    }

    /// The prompt text the model sees, the question when the request is a single question, and
    /// then the prompt rendered with a placeholder in the question's place.
    fn render(&self, req: &GenerateRequest) -> Result<(String, Option<String>, Option<String>), ServiceError> {
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
                    return Err(invalid(format!("message role {:?} is not system, user or assistant", m.role)));
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

    /// Records the request, learns from a computed answer, updates the exact cache; returns the
    /// last message's outcome. Blocking: answers from the caches call it on the blocking thread
    /// that found them (one thread hop less on the hit path), the model's answers through
    /// [`ForgeState::record`].
    fn record_now(&self, plan: &Plan, answer: Answer) -> Result<(Outcome, String), ServiceError> {
        let latency = plan.received.elapsed();
        let state = self;
        let p = plan;
        let a = &answer;
        let id = state.store.record_inference(&NewInference {
            tenant: &p.tenant,
            question: p.question.as_deref(),
            prompt: &p.prompt,
            prompt_hash: &p.prompt_hash,
            model: &state.model_name,
            model_id: &state.model_id,
            params: &p.params_json,
            cache_mode: p.mode,
            cache_key: p.cache_key.as_deref(),
            served_from: a.from,
            source_inference_id: a.source_inference_id,
            source_fact_id: a.source_fact_id,
            similarity: a.similarity.or((a.from != ServedFrom::Model).then_some(1.0)),
            prompt_tokens: p.prompt_ids.len(),
            completion_tokens: a.tokens.len(),
            tokens_computed: a.tokens_computed,
            tokens_reused: a.tokens_reused,
            stop_reason: a.stop,
            response: &a.text,
            response_tokens: &a.tokens,
            queue_ms: ms(a.queue),
            prefill_ms: ms(a.prefill),
            decode_ms: ms(a.decode),
            latency_ms: ms(latency),
            backend: &state.backend,
            ttft_ms: a.ttft.map(ms),
            kv_tokens_reused: a.kv_tokens_reused,
            draft_tokens: a.draft_tokens,
            draft_accepted: a.draft_accepted,
            candidates_tried: a.candidates_tried,
        })?;
        if let (Some(kv), Some(report)) = (&state.kv, &p.kv) {
            let decode = |t: &[u32]| state.tokenizer.decode(t, false).ok();
            if let Err(e) = kv.finish(&p.tenant, report, id, &p.prompt_ids, decode) {
                eprintln!("forge-cache: storing the KV blocks of inference {id} failed: {e}");
            }
        }
        let computed = matches!(a.from, ServedFrom::Model | ServedFrom::Verified | ServedFrom::Partial) && a.stop != StopReason::Cancelled;
        if computed && p.mode != CacheMode::Bypass {
            if let Err(e) = state.store.learn(&p.tenant, id, p.question.as_deref(), &p.prompt_hash, &a.text) {
                eprintln!("forge-cache: fact extraction for inference {id} failed: {e}");
            }
            state.learn_semantic(p, a, id);
            if let Some(ix) = &state.fact_indexer {
                // Fact embeddings are for later lookups: off the answer's path, while no
                // request runs (`cache::indexer`).
                ix.notify(&p.tenant);
            }
        }
        if let (true, Some(key)) = (computed, &p.cache_key) {
            let cached = CachedAnswer {
                inference_id: id,
                response: a.text.clone(),
                response_tokens: a.tokens.clone(),
                stop_reason: a.stop,
                tokens_computed: a.tokens_computed,
            };
            state.exact.put(key, cached);
        }
        let outcome = Outcome {
            served_from: proto::ServedFrom::from(a.from) as i32,
            stop_reason: proto::StopReason::from(a.stop) as i32,
            inference_id: id,
            source_inference_id: a.source_inference_id.unwrap_or_default(),
            source_fact_id: a.source_fact_id.unwrap_or_default(),
            similarity: a.similarity.unwrap_or(if a.from == ServedFrom::Model { 0.0 } else { 1.0 }) as f32,
            prompt_token_ids: p.prompt_ids.clone(),
            completion_tokens: a.tokens.len() as u32,
            tokens_computed: a.tokens_computed as u32,
            tokens_reused: a.tokens_reused as u32,
            queue_ms: ms(a.queue),
            prefill_ms: ms(a.prefill),
            decode_ms: ms(a.decode),
            latency_ms: ms(latency),
            peak_batch: a.peak_batch as u32,
            model: state.model_name.clone(),
            backend: state.backend.clone(),
            ttft_ms: a.ttft.map(ms).unwrap_or_default(),
            kv_tokens_reused: a.kv_tokens_reused as u32,
            draft_tokens: a.draft_tokens as u32,
            draft_tokens_accepted: a.draft_accepted as u32,
            candidates_tried: a.candidates_tried as u32,
        };
        Ok((outcome, answer.text))
    }

    /// [`ForgeState::record_now`] on the blocking pool.
    async fn record(self: &Arc<Self>, plan: Arc<Plan>, answer: Answer) -> Result<(Outcome, String), ServiceError> {
        let state = self.clone();
        tokio::task::spawn_blocking(move || state.record_now(&plan, answer)).await?
    }

    /// FACT, then EXACT, then the semantic tier: TRUST serves a neighbour's answer, else the
    /// neighbours' answers become drafts for the engine to verify. Runs on the blocking pool.
    fn lookup(&self, plan: &mut Plan) -> Result<Found, ServiceError> {
        if !matches!(plan.mode, CacheMode::Auto | CacheMode::Verified | CacheMode::Trust | CacheMode::Exact) {
            return Ok(Found::Nothing);
        }
        if let Some(q) = &plan.question {
            if let Some(fact) = self.store.fact_answer(&plan.tenant, q)? {
                let tokens = self.tokenizer.encode(&fact.content, false).map_err(|e| ServiceError::Internal(e.to_string()))?;
                let saved = plan.prompt_ids.len() + tokens.len();
                let mut a = Answer::stored(ServedFrom::Fact, fact.content, tokens, StopReason::Stop, saved);
                a.source_fact_id = Some(fact.id);
                return Ok(Found::Answer(a));
            }
        }
        if let Some(key) = &plan.cache_key {
            if let Some(hit) = self.exact.get(&plan.tenant, key)? {
                let mut a = Answer::stored(ServedFrom::Exact, hit.response.clone(), hit.response_tokens.clone(), hit.stop_reason, hit.tokens_computed);
                a.source_inference_id = Some(hit.inference_id);
                return Ok(Found::Answer(a));
            }
        }
        let (Some(sem), Some(scope), Some(question)) = (&self.semantic, &plan.scope, &plan.question) else {
            return Ok(Found::Nothing);
        };
        if plan.mode == CacheMode::Exact {
            return Ok(Found::Nothing);
        }
        let embedding = sem.embed(question).map_err(|e| ServiceError::Internal(e.to_string()))?;
        let neighbours = sem.neighbours(scope, &embedding).map_err(|e| ServiceError::Internal(e.to_string()))?;
        plan.embedding = Some(embedding);
        let Some(top) = neighbours.first() else { return Ok(Found::Nothing) };
        let greedy = plan.params.sampling.is_greedy();
        let comparable = greedy && fits_budget(top, plan.params.max_tokens);
        if plan.mode == CacheMode::Trust && comparable && sem.trust.trusts(&self.store, &plan.tenant, &self.model_id, top)? {
            let saved = plan.prompt_ids.len() + top.response_tokens.len();
            let mut a = Answer::stored(ServedFrom::Trust, top.response.clone(), top.response_tokens.clone(), top.stop_reason, saved);
            a.source_inference_id = Some(top.inference_id);
            a.similarity = Some(top.similarity);
            return Ok(Found::Answer(a));
        }
        if comparable {
            plan.top = Some(top.clone());
        }
        let stop = self.tokenizer.stop_ids().first().copied();
        Ok(Found::Drafts(neighbours.iter().take(sem.config.max_drafts).map(|n| draft_of(n, stop)).collect()))
    }

    /// After a computed answer: files the question's embedding for later neighbours, tells TRUST
    /// what verifying the nearest neighbour found, embeds new facts. Failures are logged: the
    /// answer itself is already recorded.
    fn learn_semantic(&self, plan: &Plan, answer: &Answer, id: i64) {
        let (Some(sem), Some(scope), Some(question)) = (&self.semantic, &plan.scope, &plan.question) else { return };
        let result = (|| -> Result<(), String> {
            let embedding = match &plan.embedding {
                Some(e) => e.clone(),
                None => sem.embed(question).map_err(|e| e.to_string())?,
            };
            self.store.index_prompt(&plan.tenant, scope, id, &embedding).map_err(|e| e.to_string())?;
            if let Some(top) = &plan.top {
                let correct = answer.from == ServedFrom::Verified && answer.source_inference_id == Some(top.inference_id);
                let o = SemanticOutcome { source_inference_id: top.inference_id, similarity: top.similarity, correct };
                self.store.record_outcome(&plan.tenant, &self.model_id, id, &o, answer.draft_tokens, answer.draft_accepted).map_err(|e| e.to_string())?;
                sem.trust.observe(&self.store, &plan.tenant, &self.model_id, &o).map_err(|e| e.to_string())?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            eprintln!("forge-cache: semantic indexing for inference {id} failed: {e}");
        }
    }
}

/// A request after the caches: its messages, or what the engine needs.
enum Served {
    Cached([GenerateResponse; 2]),
    Model(Plan, Vec<Draft>, Option<KvPlan>),
}

/// What the caches found for a request.
enum Found {
    Answer(Answer),
    /// Candidate answers for the engine to verify.
    Drafts(Vec<Draft>),
    Nothing,
}

impl ForgeState {
    /// The KV plan of a request the model will compute: its longest stored prefix (memory, then
    /// disk). Blocking.
    fn prepare_kv(&self, plan: &mut Plan) -> Option<KvPlan> {
        let kv = self.kv.as_ref()?.prepare(&plan.tenant, plan.kv_keys.take()?, &plan.prompt_ids);
        plan.kv = Some(kv.report().clone());
        Some(kv)
    }
}

/// Counts a Generate call as in progress until dropped (the fact indexer waits for zero).
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

fn message(text: String, token_ids: Vec<u32>, outcome: Option<Outcome>) -> GenerateResponse {
    GenerateResponse { text, token_ids, outcome }
}

/// The Generate call after tenant resolution.
pub(crate) async fn generate(state: Arc<ForgeState>, tenant: String, req: GenerateRequest) -> Result<GenerateStream, ServiceError> {
    let received = Instant::now();
    let guard = InFlight::new(&state.in_flight);
    let computed = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || -> Result<_, ServiceError> {
            let mut plan = state.plan(tenant, &req, received)?;
            let drafts = match state.lookup(&mut plan)? {
                // Served from a cache: recorded here, on the same thread.
                Found::Answer(answer) => {
                    let tokens = answer.tokens.clone();
                    let (outcome, text) = state.record_now(&plan, answer)?;
                    return Ok(Served::Cached([message(text, tokens, None), message(String::new(), Vec::new(), Some(outcome))]));
                }
                Found::Drafts(d) => d,
                Found::Nothing => Vec::new(),
            };
            let kv = state.prepare_kv(&mut plan);
            Ok(Served::Model(plan, drafts, kv))
        })
        .await??
    };
    let (plan, drafts, kv) = match computed {
        Served::Cached(msgs) => return Ok(Box::pin(tokio_stream::iter(msgs.map(Ok)))),
        Served::Model(plan, drafts, kv) => (Arc::new(plan), drafts, kv),
    };

    let (events_tx, events) = mpsc::unbounded_channel();
    let job = Job {
        prompt: plan.prompt_ids.clone(),
        params: plan.params.clone(),
        stop_strings: plan.stop_strings.clone(),
        events: events_tx,
        drafts,
        kv,
        tenant: plan.tenant.clone(),
    };
    state.scheduler.submit(job)?;
    let (out, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(stream_model(state, plan, events, out, guard));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// Forwards the engine's events to the client; records the answer at the end, or the partial
/// answer when the client goes away (dropping `events` cancels the sequence).
async fn stream_model(
    state: Arc<ForgeState>,
    plan: Arc<Plan>,
    mut events: mpsc::UnboundedReceiver<Event>,
    out: mpsc::Sender<Result<GenerateResponse, Status>>,
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
                if out.send(Ok(message(text, vec![id], None))).await.is_err() {
                    break;
                }
            }
            Some(Event::Done(f)) => {
                let tail = f.text.get(sent_text.len()..).unwrap_or_default().to_string();
                let (from, source) = match (&f.served_by, &f.partial_source) {
                    (Some(d), _) => (ServedFrom::Verified, Some(d)),
                    (None, Some(d)) => (ServedFrom::Partial, Some(d)),
                    (None, None) => (ServedFrom::Model, None),
                };
                let answer = Answer {
                    from,
                    text: f.text,
                    tokens: f.tokens,
                    stop: f.stop,
                    source_inference_id: source.map(|d| d.source),
                    source_fact_id: None,
                    tokens_computed: f.computed,
                    tokens_reused: f.draft_accepted + f.kv_reused,
                    queue: f.queue_time,
                    prefill: f.prefill_time,
                    decode: f.decode_time,
                    peak_batch: f.peak_batch,
                    ttft: ttft.or_else(|| Some(plan.received.elapsed())),
                    kv_tokens_reused: f.kv_reused,
                    draft_tokens: f.draft_tokens,
                    draft_accepted: f.draft_accepted,
                    candidates_tried: f.candidates_tried,
                    similarity: source.map(|d| d.similarity),
                };
                let last = state.record(plan, answer).await.map(|(outcome, _)| message(tail, Vec::new(), Some(outcome)));
                // Done before the client hears so: its next request finds the service idle.
                drop(in_flight);
                let _ = out.send(last.map_err(Status::from)).await;
                return;
            }
            Some(Event::Failed(e)) => {
                let _ = out.send(Err(ServiceError::Job(e).into())).await;
                return;
            }
            None => {
                let _ = out.send(Err(ServiceError::Internal("the engine stopped".into()).into())).await;
                return;
            }
        }
    }
    // The client went away.
    drop(events);
    let reused = plan.kv.as_ref().map_or(0, |r| r.reused_tokens());
    let computed = plan.prompt_ids.len() - reused + sent_ids.len().saturating_sub(1);
    let mut answer = Answer::stored(ServedFrom::Model, sent_text, sent_ids, StopReason::Cancelled, reused);
    answer.tokens_computed = computed;
    answer.kv_tokens_reused = reused;
    answer.ttft = ttft;
    if let Err(e) = state.record(plan, answer).await {
        eprintln!("forge-cache: recording a cancelled request failed: {e}");
    }
}
