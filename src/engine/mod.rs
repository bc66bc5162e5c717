//! The inference engine: tokenizer and chat template for GGUF models (more modules to come).
//!
//! * `tokenizer` — byte-level BPE from GGUF metadata, matching llama.cpp's token ids
//! * `chat` — the GGUF `tokenizer.chat_template` (Jinja) rendered with minijinja

pub mod chat;
pub mod tokenizer;
