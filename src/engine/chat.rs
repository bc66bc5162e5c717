//! Chat templates: the Jinja string a GGUF file carries in `tokenizer.chat_template`, rendered
//! with minijinja into the exact prompt text the model was trained on.
//!
//! The environment mirrors what Hugging Face templates expect (and what `transformers` and
//! llama.cpp give them): variables `messages` (list of `{role, content}`), `add_generation_prompt`,
//! `bos_token`, `eos_token`; `raise_exception(message)` and `strftime_now(format)` functions;
//! Python's string and dict methods (`.startswith`, `.split`, `.items()`, ... from
//! `minijinja-contrib`, which Qwen3's template needs); `trim_blocks` and `lstrip_blocks` on. Every
//! failure — a template that does not compile, one that calls `raise_exception`, one that fails
//! while rendering — is a [`ChatError`], never a panic.
//!
//! A file without a template gets the built-in one of its family when its vocabulary shows which
//! ([`builtin_for`]: Gemma's turns, ChatML, Llama 3's headers, Phi-3's tags), as llama.cpp falls
//! back to its own renderers; otherwise there is none and prompts are sent raw.

use std::collections::BTreeMap;

use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::gguf::{GgufError, GgufFile, Value};

pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

const TEMPLATE_NAME: &str = "tokenizer.chat_template";
/// Marks errors produced by `raise_exception` so they can be told apart from other failures.
const RAISED_TAG: &str = "raise_exception: ";

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker: `system`, `user` or `assistant`.
    pub role: String,
    /// Text of the turn.
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message { role: role.into(), content: content.into() }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("chat template does not compile: {0}")]
    Syntax(#[source] minijinja::Error),
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(#[source] minijinja::Error),
}

/// A compiled chat template plus the special-token strings it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (a Hugging Face style Jinja chat template).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_template_owned(TEMPLATE_NAME, source.clone()).map_err(ChatError::Syntax)?;
        Ok(ChatTemplate { env, source, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// The file's chat template, or `None` when it has none. `bos_token`/`eos_token` are the texts
    /// of `tokenizer.ggml.bos_token_id`/`eos_token_id` (empty when unset).
    pub fn from_gguf(gguf: &GgufFile) -> Result<Option<ChatTemplate>, ChatError> {
        ChatTemplate::from_metadata(&gguf.metadata)
    }

    /// As [`ChatTemplate::from_gguf`], from GGUF-style metadata.
    pub fn from_metadata(meta: &BTreeMap<String, Value>) -> Result<Option<ChatTemplate>, ChatError> {
        let source = match meta.get(KEY_CHAT_TEMPLATE) {
            None => match builtin_for(meta) {
                Some(b) => b.source,
                None => return Ok(None),
            },
            Some(Value::String(s)) => s,
            Some(v) => {
                return Err(GgufError::WrongType {
                    key: KEY_CHAT_TEMPLATE.into(),
                    found: v.type_name(),
                    expected: "string",
                }
                .into())
            }
        };
        let token_text = |key: &str| -> String {
            let tokens = match meta.get("tokenizer.ggml.tokens") {
                Some(Value::Array(a)) => a.as_slice(),
                _ => &[],
            };
            let id = meta.get(key).and_then(Value::as_u64).and_then(|id| usize::try_from(id).ok());
            match id.and_then(|i| tokens.get(i)) {
                Some(Value::String(s)) => s.clone(),
                _ => String::new(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        ChatTemplate::new(source.to_string(), bos, eos).map(Some)
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, followed by the opening of
    /// the assistant's turn. Tokenize it with special tokens parsed.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, ChatError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(ChatError::Render)?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| {
                let raised = match (e.kind(), e.detail()) {
                    (ErrorKind::InvalidOperation, Some(d)) => d.strip_prefix(RAISED_TAG).map(str::to_owned),
                    _ => None,
                };
                match raised {
                    Some(msg) => ChatError::Raised(msg),
                    None => ChatError::Render(e),
                }
            })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// A chat template this crate carries for files that have none.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// Short name (`gemma`, `llama3`, `phi3`, `chatml`).
    pub name: &'static str,
    /// Tokens whose presence in the vocabulary selects it.
    pub tokens: &'static [&'static str],
    /// Jinja source of the template.
    pub source: &'static str,
}

/// Gemma's turns (what llama.cpp renders for its `gemma` template and Google's Gemma 3 template
/// does): a system message is prefixed to the first user turn, contents are trimmed, the
/// assistant is `model`.
const GEMMA: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] | trim ~ '\n\n' %}{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{ '<start_of_turn>' ~ role ~ '\n' ~ (first_user_prefix if loop.first else '') ~ message['content'] | trim ~ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";
/// ChatML (Qwen and others).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' ~ message['role'] ~ '\n' ~ message['content'] ~ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
/// Llama 3's header blocks.
const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\n\n' ~ message['content'] | trim ~ '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
/// Phi-3's role tags.
const PHI3: &str = "{% for message in messages %}{{ '<|' ~ message['role'] ~ '|>\n' ~ message['content'] ~ '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";

/// The built-in templates, tried in order.
pub const BUILTINS: [Builtin; 4] = [
    Builtin { name: "gemma", tokens: &["<start_of_turn>", "<end_of_turn>"], source: GEMMA },
    Builtin { name: "llama3", tokens: &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], source: LLAMA3 },
    Builtin { name: "phi3", tokens: &["<|user|>", "<|assistant|>", "<|end|>"], source: PHI3 },
    Builtin { name: "chatml", tokens: &["<|im_start|>", "<|im_end|>"], source: CHATML },
];

/// The built-in template for a vocabulary that has all of a template's tokens, if one does.
pub fn builtin_for(meta: &BTreeMap<String, Value>) -> Option<Builtin> {
    let Some(Value::Array(tokens)) = meta.get("tokenizer.ggml.tokens") else { return None };
    let has = |t: &str| tokens.iter().any(|v| matches!(v, Value::String(s) if s == t));
    BUILTINS.into_iter().find(|b| b.tokens.iter().all(|t| has(t)))
}

/// `strftime_now(format)` (llama.cpp and `transformers` give templates this): the current UTC
/// date and time in C `strftime` style; %d %m %Y %y %b %B %a %A %H %M %S %j %e %% are supported.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

/// `format` for the UTC time `secs` after the Unix epoch.
fn strftime(format: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = (secs / 86_400) as i64;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let (h, mi, se) = ((secs % 86_400) / 3600, (secs % 3600) / 60, secs % 60);
    let (mname, dname) = (MONTHS[(month - 1) as usize], DAYS[(days.rem_euclid(7)) as usize]);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:2}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&mname[..3]),
            Some('B') => out.push_str(mname),
            Some('a') => out.push_str(&dname[..3]),
            Some('A') => out.push_str(dname),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{mi:02}")),
            Some('S') => out.push_str(&format!("{se:02}")),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// `raise_exception(message)`, as templates call it to reject a conversation.
fn raise_exception(message: String) -> Result<minijinja::Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED_TAG}{message}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2, "<|im_start|>", "<|im_end|>").expect("compiles");
        let out = t.render(&[Message::user("Hi")], true).expect("renders");
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[Message::system("S"), Message::user("Hi")], false).expect("renders");
        assert_eq!(out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn bos_eos_and_block_trimming() {
        let src =
            "{{ bos_token }}\n{% for m in messages %}\n  {{ m.role }}: {{ m.content }}{{ eos_token }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        assert_eq!(
            t.render(&[Message::user("a"), Message::assistant("b")], false).expect("renders"),
            "<s>\n  user: a</s>\n  assistant: b</s>\n"
        );
    }

    #[test]
    fn syntax_error_is_an_error() {
        let err = ChatTemplate::new("{% for m in %}", "", "").expect_err("must not compile");
        assert!(matches!(err, ChatError::Syntax(_)));
        assert!(err.to_string().starts_with("chat template does not compile"), "{err}");
    }

    #[test]
    fn raise_exception_is_reported_with_its_message() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let err = t.render(&[Message::assistant("x")], true).expect_err("must raise");
        assert!(matches!(err, ChatError::Raised(ref m) if m == "Conversation must start with user"), "{err}");
        assert_eq!(t.render(&[Message::user("x")], true).expect("renders"), "ok");
    }

    #[test]
    fn render_failures_are_errors() {
        let t = ChatTemplate::new("{{ no_such_function() }}", "", "").expect("compiles");
        let err = t.render(&[], true).expect_err("must fail");
        assert!(matches!(err, ChatError::Render(_)), "{err}");
        let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").expect("compiles");
        assert!(matches!(t.render(&[Message::user("x")], true), Err(ChatError::Render(_))));
    }

    #[test]
    fn from_metadata_reads_template_and_token_texts() {
        let mut meta = BTreeMap::new();
        assert!(ChatTemplate::from_metadata(&meta).expect("ok").is_none());
        meta.insert(KEY_CHAT_TEMPLATE.into(), Value::String("{{ bos_token }}|{{ eos_token }}".into()));
        meta.insert(
            "tokenizer.ggml.tokens".into(),
            Value::Array(vec![Value::String("<s>".into()), Value::String("</s>".into())]),
        );
        meta.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(0));
        meta.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(1));
        let t = ChatTemplate::from_metadata(&meta).expect("ok").expect("present");
        assert_eq!(t.render(&[], false).expect("renders"), "<s>|</s>");
        meta.insert(KEY_CHAT_TEMPLATE.into(), Value::U32(3));
        assert!(matches!(ChatTemplate::from_metadata(&meta), Err(ChatError::Gguf(GgufError::WrongType { .. }))));
    }

    #[test]
    fn builtin_templates_by_vocabulary() {
        let meta = |toks: &[&str]| -> BTreeMap<String, Value> {
            let mut m = BTreeMap::new();
            m.insert("tokenizer.ggml.tokens".into(), Value::Array(toks.iter().map(|t| Value::String(t.to_string())).collect()));
            m.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(0));
            m
        };
        let g = ChatTemplate::from_metadata(&meta(&["<bos>", "<start_of_turn>", "<end_of_turn>"])).expect("ok").expect("gemma");
        // Gemma 3's prompt for one user turn, as llama.cpp's reference raw prompts have it.
        assert_eq!(
            g.render(&[Message::user(" What is the capital of France? ")], true).expect("renders"),
            "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"
        );
        // A system message joins the first user turn; roles must alternate.
        assert_eq!(
            g.render(&[Message::system("Be brief."), Message::user("Hi"), Message::assistant("Hello"), Message::user("Bye")], false).expect("renders"),
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
        );
        assert!(matches!(g.render(&[Message::user("a"), Message::user("b")], true), Err(ChatError::Raised(_))));
        let c = ChatTemplate::from_metadata(&meta(&["<|im_start|>", "<|im_end|>"])).expect("ok").expect("chatml");
        assert_eq!(c.render(&[Message::user("Hi")], true).expect("renders"), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        assert!(ChatTemplate::from_metadata(&meta(&["<s>", "</s>"])).expect("ok").is_none(), "no family, no template");
    }

    #[test]
    fn python_methods_and_strftime_now() {
        // What Qwen3's template calls: string methods through minijinja-contrib's pycompat.
        let src = "{% set c = messages[0]['content'] %}{{ c.startswith('Hi') }} {{ c.split(' ')[1] }} {{ c.strip('!') }} {{ c.replace('there', 'you') }}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        assert_eq!(t.render(&[Message::user("Hi there!")], false).expect("renders"), "True there! Hi there Hi you!");
        // 2024-07-26 (a Friday) 16:51:49 UTC, as Llama 3.1's template formats "Today Date".
        assert_eq!(strftime("%d %b %Y|%A %j %H:%M:%S %%", 1_722_099_109 - 86_400), "26 Jul 2024|Friday 208 16:51:49 %");
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
        let t = ChatTemplate::new("{{ strftime_now('%Y') | length }}", "", "").expect("compiles");
        assert_eq!(t.render(&[], false).expect("renders"), "4");
    }

    #[test]
    fn message_serde_round_trip() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("parses");
        assert_eq!(m, Message::user("hi"));
        assert_eq!(serde_json::to_string(&m).expect("serializes"), r#"{"role":"user","content":"hi"}"#);
    }
}
