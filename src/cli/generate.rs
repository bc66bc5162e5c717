//! `forge-cache generate`: run the model offline on one prompt and print the text as it is
//! produced, then prefill and decode speed. `--json` prints one object instead:
//! `{prompt_tokens: [ids], tokens: [ids], text, prefill_tok_s, decode_tok_s, stop_reason}`.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Args;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::engine::chat::{ChatTemplate, Message};
use forge_cache::engine::generate::{generate, GenerateParams};
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::tokenizer::{StreamDecoder, Tokenizer};
use forge_cache::engine::Model;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The prompt (a user message with --chat, literal text with --raw).
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template (the default when the model has one).
    #[arg(long, conflicts_with = "raw")]
    pub chat: bool,
    /// Tokenize the prompt as given: special tokens parsed, no template.
    #[arg(long)]
    pub raw: bool,
    /// System message for --chat (otherwise the template's default, if any).
    #[arg(long, conflicts_with = "raw")]
    pub system: Option<String>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Same seed, same text (sampling only).
    #[arg(long)]
    pub seed: Option<u64>,
    /// GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from scripts/fetch-models.sh).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// CPU threads (default: physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct JsonOut<'a> {
    prompt_tokens: &'a [u32],
    tokens: &'a [u32],
    text: String,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    stop_reason: forge_cache::engine::generate::StopReason,
}

pub fn run(a: &GenerateArgs) -> anyhow::Result<()> {
    if a.prompt.is_empty() {
        bail!("--prompt is empty");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let sampling = SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed };
    sampling.validate()?;
    let path = a.model.clone().unwrap_or_else(forge_cache::models::default_llm);
    if !path.exists() {
        bail!(forge_cache::models::missing_hint(&path));
    }
    let backend = Arc::new(CpuBackend::new(a.threads)?);
    let model = Model::load(&path, backend).with_context(|| format!("loading {}", path.display()))?;
    let tok = Tokenizer::from_gguf(&model.gguf)?;
    let template = ChatTemplate::from_gguf(&model.gguf)?;

    let text = match (&template, a.raw) {
        (Some(t), false) => {
            let mut msgs = Vec::new();
            if let Some(s) = &a.system {
                msgs.push(Message { role: "system".into(), content: s.clone() });
            }
            msgs.push(Message { role: "user".into(), content: a.prompt.clone() });
            t.render(&msgs, true)?
        }
        (None, false) if a.chat => bail!("{} has no chat template; use --raw", path.display()),
        _ => a.prompt.clone(),
    };
    let prompt = tok.encode_prompt(&text)?;
    let params = GenerateParams { max_tokens: a.max_tokens, sampling, stop_ids: tok.stop_ids().to_vec() };
    let mut state = model.new_state(512);

    let mut stream = StreamDecoder::new(true);
    let mut out = std::io::stdout().lock();
    let gen = generate(&model, &mut state, &prompt, &params, |id| {
        if !a.json {
            // A closed stdout (e.g. `| head`) stops generation instead of panicking.
            let ok = match stream.push(&tok, id) {
                Ok(piece) => out.write_all(piece.as_bytes()).and_then(|_| out.flush()).is_ok(),
                Err(_) => false,
            };
            if !ok {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    })?;
    let text = tok.decode(&gen.tokens, true)?;
    if a.json {
        let j = JsonOut {
            prompt_tokens: &prompt,
            tokens: &gen.tokens,
            text,
            prefill_tok_s: gen.prefill_tok_s(),
            decode_tok_s: gen.decode_tok_s(),
            stop_reason: gen.stop,
        };
        writeln!(out, "{}", serde_json::to_string(&j)?)?;
    } else {
        let _ = writeln!(out, "{}", stream.finish()).and_then(|_| out.flush());
        eprintln!(
            "prompt: {} tokens, {:.1} tokens/s | generated: {} tokens, {:.1} tokens/s | stop: {:?} | {}",
            gen.prompt_tokens,
            gen.prefill_tok_s(),
            gen.tokens.len(),
            gen.decode_tok_s(),
            gen.stop,
            model.backend().name()
        );
    }
    Ok(())
}
