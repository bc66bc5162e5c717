//! Chat templates: the Jinja string a GGUF file carries in `tokenizer.chat_template`, rendered
//! with minijinja into the exact prompt text the model was trained on.
//!
//! The environment mirrors what Hugging Face templates expect (and what `transformers` and
//! llama.cpp give them): variables `messages` (list of `{role, content}`), `add_generation_prompt`,
//! `bos_token`, `eos_token`; a `raise_exception(message)` function; `trim_blocks` and
//! `lstrip_blocks` on. Every failure — a template that does not compile, one that calls
//! `raise_exception`, one that fails while rendering — is a [`ChatError`], never a panic.

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
    pub role: String,
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
            None => return Ok(None),
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
        ChatTemplate::new(source.clone(), bos, eos).map(Some)
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
    fn message_serde_round_trip() {
        let m: Message = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("parses");
        assert_eq!(m, Message::user("hi"));
        assert_eq!(serde_json::to_string(&m).expect("serializes"), r#"{"role":"user","content":"hi"}"#);
    }
}
