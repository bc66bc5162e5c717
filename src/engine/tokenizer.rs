//! The LLM tokenizer, built from a GGUF file's `tokenizer.ggml.*` metadata so that it gives the
//! same token ids as llama.cpp.
//!
//! Supported: `tokenizer.ggml.model = "gpt2"` (byte-level BPE, as used by SmolLM2, GPT-2,
//! StarCoder, …). The BPE model, the byte-level pre-tokenizer and decoder come from the
//! `tokenizers` crate; this module adds what llama.cpp does around them:
//!
//! * **special-token partitioning** — before BPE the text is cut at every occurrence of a control,
//!   unknown or user-defined token (longest token text first, exactly like llama.cpp's
//!   `tokenizer_st_partition`). Control/unknown tokens are only matched when `parse_special` is
//!   true; user-defined tokens are always matched. Everything between them is plain text.
//! * **the pre-tokenizer named by `tokenizer.ggml.pre`** — `"smollm"` (and the other llama.cpp
//!   types that share its regexes) isolates every `\p{N}` character, then applies the GPT-2 regex;
//!   `"gpt-2"`-like types apply only the GPT-2 regex. Anything else falls back to the GPT-2 regex,
//!   and says so: a line on stderr at load and [`Tokenizer::warnings`].
//! * **decoding** through a per-token byte table ([`Tokenizer::token_bytes`]), so a generation loop
//!   can stream text with [`StreamDecoder`] without ever splitting a UTF-8 character.

use std::collections::BTreeMap;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;

use crate::gguf::{GgufError, GgufFile, Value};

pub const KEY_MODEL: &str = "tokenizer.ggml.model";
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";

/// `tokenizer.ggml.pre` values that llama.cpp pre-tokenizes with `\p{N}` then the GPT-2 regex.
const DIGITS_THEN_GPT2: &[&str] = &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"];
/// `tokenizer.ggml.pre` values that llama.cpp pre-tokenizes with the GPT-2 regex alone.
const GPT2_ONLY: &[&str] = &["gpt-2", "mpt", "olmo", "jais", "trillion", "granite-docling"];
/// Token texts that end generation when present (besides the eos/eot/eom ids).
const STOP_TEXTS: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported tokenizer model {0:?} in tokenizer.ggml.model (supported: \"gpt2\", byte-level BPE)")]
    UnsupportedModel(String),
    #[error("tokenizer metadata {key}: {msg}")]
    BadMetadata { key: &'static str, msg: String },
    #[error("token id {id} is out of range (vocabulary has {vocab_size} tokens)")]
    IdOutOfRange { id: u32, vocab_size: usize },
    #[error("text fragment {fragment:?} contains bytes the vocabulary cannot represent")]
    Unrepresentable { fragment: String },
    #[error("tokenizers library: {0}")]
    Library(String),
}

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    /// 1 (and 0 "undefined", and any unknown value).
    Normal,
    /// 2
    Unknown,
    /// 3: control/special tokens such as `<|im_start|>`.
    Control,
    /// 4: always matched as a whole in the input, rendered as its text.
    UserDefined,
    /// 5: never produced, rendered as nothing.
    Unused,
    /// 6: a `<0xXX>` byte token.
    Byte,
}

impl TokenType {
    fn from_gguf(v: u64) -> TokenType {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
}

/// How plain text is split before BPE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PreTokenizer {
    /// Every `\p{N}` character on its own, then the GPT-2 regex (llama.cpp's `smollm`,
    /// `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`).
    DigitsThenGpt2,
    /// The GPT-2 regex alone (llama.cpp's `gpt-2`, `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`).
    Gpt2,
    /// `tokenizer.ggml.pre` is missing or not supported here: the GPT-2 regex as a best effort
    /// (ids may differ from llama.cpp's).
    Gpt2Fallback { requested: Option<String> },
}

impl PreTokenizer {
    fn from_pre(pre: Option<&str>) -> PreTokenizer {
        match pre {
            Some(p) if DIGITS_THEN_GPT2.contains(&p) => PreTokenizer::DigitsThenGpt2,
            Some(p) if GPT2_ONLY.contains(&p) => PreTokenizer::Gpt2,
            other => PreTokenizer::Gpt2Fallback { requested: other.map(str::to_owned) },
        }
    }

    fn build(&self) -> PreTokenizerWrapper {
        // No prefix space (llama.cpp adds none for gpt2 vocabularies); offsets are not used.
        let byte_level = ByteLevel::new(false, false, true);
        match self {
            PreTokenizer::DigitsThenGpt2 => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            PreTokenizer::Gpt2 | PreTokenizer::Gpt2Fallback { .. } => byte_level.into(),
        }
    }
}

/// A piece of input after special-token partitioning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A byte-level BPE tokenizer read from GGUF metadata. Cheap to share (`Send + Sync`).
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Bytes each token decodes to: `piece_bytes[piece_offsets[i]..piece_offsets[i + 1]]`.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<usize>,
    /// Control, unknown and user-defined tokens, longest text first (partitioning order).
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    pre: PreTokenizer,
    stop: Vec<u32>,
    warnings: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("stop", &self.stop)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_metadata(&gguf.metadata)
    }

    /// Builds the tokenizer from GGUF-style metadata (what [`GgufFile::metadata`] holds).
    pub fn from_metadata(meta: &BTreeMap<String, Value>) -> Result<Tokenizer, TokenizerError> {
        let model = meta_str(meta, KEY_MODEL)?.ok_or_else(|| GgufError::MissingKey(KEY_MODEL.into()))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        let tokens = meta_strings(meta, KEY_TOKENS)?.ok_or_else(|| GgufError::MissingKey(KEY_TOKENS.into()))?;
        let n = tokens.len();
        if n == 0 || u32::try_from(n).is_err() {
            return Err(TokenizerError::BadMetadata { key: KEY_TOKENS, msg: format!("{n} tokens") });
        }
        let types = match meta.get(KEY_TOKEN_TYPE) {
            None => vec![TokenType::Normal; n],
            Some(Value::Array(a)) if a.len() == n => a
                .iter()
                .map(|v| v.as_u64().map(TokenType::from_gguf))
                .collect::<Option<Vec<_>>>()
                .ok_or(TokenizerError::BadMetadata { key: KEY_TOKEN_TYPE, msg: "non-integer entry".into() })?,
            Some(Value::Array(a)) => {
                return Err(TokenizerError::BadMetadata {
                    key: KEY_TOKEN_TYPE,
                    msg: format!("{} entries for {n} tokens", a.len()),
                })
            }
            Some(v) => return Err(wrong_type(KEY_TOKEN_TYPE, v, "array").into()),
        };
        let merge_strs = meta_strings(meta, KEY_MERGES)?.ok_or_else(|| GgufError::MissingKey(KEY_MERGES.into()))?;

        let mut warnings = Vec::new();
        let pre = PreTokenizer::from_pre(meta_str(meta, KEY_PRE)?);
        if let PreTokenizer::Gpt2Fallback { requested } = &pre {
            warnings.push(format!(
                "{KEY_PRE} = {requested:?} is not supported; falling back to the GPT-2 byte-level \
                 pre-tokenizer (token ids may differ from llama.cpp)"
            ));
        }
        let mut id = |key: &'static str| meta_id(meta, key, n, &mut warnings);
        let (bos, eos, unk, pad) = (id(KEY_BOS)?, id(KEY_EOS)?, id(KEY_UNK)?, id(KEY_PAD)?);
        let (eot, eom) = (id(KEY_EOT)?, id(KEY_EOM)?);
        let add_bos = match meta.get(KEY_ADD_BOS) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(wrong_type(KEY_ADD_BOS, v, "bool").into()),
        };

        // BPE model. Later duplicates of a token text win, as in llama.cpp's text→id map.
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let mut merges = Vec::with_capacity(merge_strs.len());
        let mut dropped = 0usize;
        for m in &merge_strs {
            // llama.cpp splits at the first space after the first byte.
            let split = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
            let Some(i) = split else {
                return Err(TokenizerError::BadMetadata { key: KEY_MERGES, msg: format!("merge {m:?} has no space") });
            };
            let (a, b) = (&m[..i], &m[i + 1..]);
            if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")) {
                merges.push((a.to_owned(), b.to_owned()));
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            warnings.push(format!("{dropped} merges name tokens missing from the vocabulary and were ignored"));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| TokenizerError::Library(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre.build()));
        inner.with_decoder(Some(ByteLevel::default()));

        // Byte table for decoding.
        let char_to_byte = byte_level_char_to_byte();
        let mut piece_bytes = Vec::new();
        let mut piece_offsets = Vec::with_capacity(n + 1);
        piece_offsets.push(0);
        for (text, ty) in tokens.iter().zip(&types) {
            match ty {
                TokenType::Normal => {
                    for c in text.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => piece_bytes.push(b),
                            // Not a byte-level symbol: keep the character itself.
                            None => piece_bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                TokenType::Control | TokenType::Unknown | TokenType::UserDefined => {
                    piece_bytes.extend_from_slice(text.as_bytes())
                }
                TokenType::Byte => match parse_byte_token(text) {
                    Some(b) => piece_bytes.push(b),
                    None => piece_bytes.extend_from_slice(text.as_bytes()),
                },
                TokenType::Unused => {}
            }
            piece_offsets.push(piece_bytes.len());
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                matches!(types[i as usize], TokenType::Control | TokenType::Unknown | TokenType::UserDefined)
                    && !tokens[i as usize].is_empty()
            })
            .collect();
        specials.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()).then(a.cmp(&b)));

        let mut stop: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        stop.extend(STOP_TEXTS.iter().filter_map(|t| inner.token_to_id(t)));
        stop.sort_unstable();
        stop.dedup();

        for w in &warnings {
            tracing::warn!("tokenizer: {w}");
        }
        Ok(Tokenizer {
            inner,
            tokens,
            types,
            piece_bytes,
            piece_offsets,
            specials,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            pre,
            stop,
            warnings,
        })
    }

    /// Token ids of `text`. With `parse_special`, control tokens written in the text (such as
    /// `<|im_start|>`) become their single ids; without it they are tokenized as plain text.
    /// User-defined tokens are matched either way. No BOS is added (see [`Tokenizer::encode_prompt`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        for fragment in self.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s) => {
                    let enc = self.inner.encode_fast(s, false).map_err(|e| TokenizerError::Library(e.to_string()))?;
                    let ids = enc.get_ids();
                    // The BPE model silently drops characters missing from the vocabulary; refuse instead.
                    let covered: usize = ids.iter().map(|&id| self.piece(id).map_or(0, <[u8]>::len)).sum();
                    if covered != s.len() {
                        return Err(TokenizerError::Unrepresentable { fragment: s.to_owned() });
                    }
                    out.extend_from_slice(ids);
                }
            }
        }
        Ok(out)
    }

    /// A prompt as the model expects it: special tokens parsed, BOS first when the model asks for it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            ids.push(bos);
        }
        ids.extend(self.encode(text, true)?);
        Ok(ids)
    }

    /// Text of `ids`. With `skip_special`, control and unknown tokens are left out; otherwise
    /// they are written as their text (so `decode(encode(s, true))` gives `s` back).
    /// Byte sequences that are not valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let piece = self.piece(id).ok_or(self.out_of_range(id))?;
            if !(skip_special && self.is_special(id)) {
                bytes.extend_from_slice(piece);
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The bytes token `id` decodes to (control tokens: their text). A token may end in the middle
    /// of a UTF-8 character; [`StreamDecoder`] reassembles them. `None` when `id` is out of range.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.piece(id)
    }

    /// The token's text as stored in GGUF (byte-level symbols, e.g. `Ġthe` for ` the`).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token by its GGUF text (byte-level symbols: `Ġthe`, or `<|im_end|>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Control (and unknown) tokens: parsed only with `parse_special`, left out by `skip_special`.
    pub fn is_special(&self, id: u32) -> bool {
        matches!(self.token_type(id), Some(TokenType::Control | TokenType::Unknown))
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`, false when absent).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Ids that end generation: eos, eot/eom when set, and `<|im_end|>`, `<|endoftext|>`,
    /// `<|eot_id|>`, `<|end|>`, `<end_of_turn>` when the vocabulary has them. Sorted, no repeats.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.binary_search(&id).is_ok()
    }

    pub fn pre_tokenizer(&self) -> &PreTokenizer {
        &self.pre
    }

    /// Problems found at load that did not stop it (also printed to stderr once, at load).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The underlying `tokenizers` pipeline (BPE + pre-tokenizer + ByteLevel decoder), without
    /// the special-token handling of this type.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    fn piece(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (&start, &end) = (self.piece_offsets.get(i)?, self.piece_offsets.get(i + 1)?);
        self.piece_bytes.get(start..end)
    }

    fn out_of_range(&self, id: u32) -> TokenizerError {
        TokenizerError::IdOutOfRange { id, vocab_size: self.tokens.len() }
    }

    /// llama.cpp's special-token partitioning: for each special token, longest text first, cut
    /// every remaining text fragment at its (non-overlapping, leftmost-first) occurrences.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut frags = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            if !parse_special && self.is_special(id) {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            if !frags.iter().any(|f| matches!(f, Fragment::Text(s) if s.contains(needle))) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 4);
            for f in frags {
                let Fragment::Text(s) = f else {
                    next.push(f);
                    continue;
                };
                let mut last = 0;
                for (pos, m) in s.match_indices(needle) {
                    if pos > last {
                        next.push(Fragment::Text(&s[last..pos]));
                    }
                    next.push(Fragment::Token(id));
                    last = pos + m.len();
                }
                if last < s.len() {
                    next.push(Fragment::Text(&s[last..]));
                }
            }
            frags = next;
        }
        frags
    }
}

/// Turns generated token ids into text as they arrive, holding back the bytes of a UTF-8
/// character until it is complete.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    skip_special: bool,
}

impl StreamDecoder {
    /// `skip_special`: leave control tokens out of the text (usual for printing a reply).
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), skip_special }
    }

    /// Adds one token; returns the text that became complete (often empty mid-character).
    /// Invalid UTF-8 is replaced by U+FFFD as soon as it cannot become valid.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let piece = tokenizer.piece(id).ok_or(tokenizer.out_of_range(id))?;
        if self.skip_special && tokenizer.is_special(id) {
            return Ok(String::new());
        }
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return Ok(out);
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is UTF-8 by definition of `valid_up_to`.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                        None => {
                            // An incomplete character at the end: wait for more bytes.
                            self.pending.drain(..valid);
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still held back (an unfinished character becomes U+FFFD); resets the decoder.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// GPT-2's `bytes_to_unicode`, inverted: the symbol used for each byte → the byte.
fn byte_level_char_to_byte() -> std::collections::HashMap<char, u8> {
    let mut map = std::collections::HashMap::with_capacity(256);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            n += 1;
            // 256..=323: always a valid scalar value.
            char::from_u32(255 + n).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

/// `<0x0A>` → 0x0A.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

fn wrong_type(key: &str, v: &Value, expected: &'static str) -> GgufError {
    GgufError::WrongType { key: key.into(), found: v.type_name(), expected }
}

fn meta_str<'m>(meta: &'m BTreeMap<String, Value>, key: &str) -> Result<Option<&'m str>, GgufError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong_type(key, v, "string")),
    }
}

fn meta_strings(meta: &BTreeMap<String, Value>, key: &str) -> Result<Option<Vec<String>>, GgufError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong_type(key, other, "array of strings")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(v) => Err(wrong_type(key, v, "array of strings")),
    }
}

/// An optional token id; one outside the vocabulary is ignored with a warning (as llama.cpp does).
fn meta_id(
    meta: &BTreeMap<String, Value>,
    key: &'static str,
    n: usize,
    warnings: &mut Vec<String>,
) -> Result<Option<u32>, GgufError> {
    let Some(v) = meta.get(key) else { return Ok(None) };
    let id = v.as_u64().ok_or_else(|| wrong_type(key, v, "unsigned integer"))?;
    if id >= n as u64 {
        warnings.push(format!("{key} = {id} is outside the vocabulary ({n} tokens); ignored"));
        return Ok(None);
    }
    Ok(Some(id as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A tiny byte-level vocabulary: 3 control tokens, the 256 byte symbols, a few merges,
    /// one user-defined token.
    fn meta(pre: &str) -> BTreeMap<String, Value> {
        let mut byte_syms: Vec<(char, u8)> = byte_level_char_to_byte().into_iter().collect();
        byte_syms.sort_by_key(|&(_, b)| b);
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from).to_vec();
        tokens.extend(byte_syms.iter().map(|(c, _)| c.to_string()));
        let merged = ["he", "ll", "hell", "hello", "Ġw", "12"];
        tokens.extend(merged.iter().map(|s| s.to_string()));
        tokens.push("<tool>".into());
        let mut types = vec![Value::I32(3); 3];
        types.extend(std::iter::repeat_n(Value::I32(1), tokens.len() - 4));
        types.push(Value::I32(4));
        let mut m = BTreeMap::new();
        m.insert(KEY_MODEL.into(), Value::String("gpt2".into()));
        m.insert(KEY_PRE.into(), Value::String(pre.into()));
        m.insert(KEY_TOKENS.into(), Value::Array(tokens.into_iter().map(Value::String).collect()));
        m.insert(KEY_TOKEN_TYPE.into(), Value::Array(types));
        m.insert(KEY_MERGES.into(), strs(&["h e", "l l", "he ll", "hell o", "Ġ w", "1 2"]));
        m.insert(KEY_BOS.into(), Value::U32(1));
        m.insert(KEY_EOS.into(), Value::U32(2));
        m.insert(KEY_ADD_BOS.into(), Value::Bool(false));
        m
    }

    fn tok(pre: &str) -> Tokenizer {
        Tokenizer::from_metadata(&meta(pre)).expect("tokenizer")
    }

    #[test]
    fn unsupported_model_is_a_clear_error() {
        let mut m = meta("smollm");
        m.insert(KEY_MODEL.into(), Value::String("llama".into()));
        let err = Tokenizer::from_metadata(&m).expect_err("must fail");
        assert!(matches!(err, TokenizerError::UnsupportedModel(ref s) if s == "llama"), "{err}");
        assert!(err.to_string().contains("\"llama\""));
        m.remove(KEY_MODEL);
        assert!(matches!(Tokenizer::from_metadata(&m), Err(TokenizerError::Gguf(GgufError::MissingKey(_)))));
    }

    #[test]
    fn bad_merge_and_bad_types_are_errors() {
        let mut m = meta("smollm");
        m.insert(KEY_MERGES.into(), strs(&["nospace"]));
        assert!(matches!(Tokenizer::from_metadata(&m), Err(TokenizerError::BadMetadata { key: KEY_MERGES, .. })));
        let mut m = meta("smollm");
        m.insert(KEY_TOKEN_TYPE.into(), Value::Array(vec![Value::I32(1)]));
        assert!(matches!(Tokenizer::from_metadata(&m), Err(TokenizerError::BadMetadata { key: KEY_TOKEN_TYPE, .. })));
        let mut m = meta("smollm");
        m.insert(KEY_TOKENS.into(), Value::String("x".into()));
        assert!(matches!(Tokenizer::from_metadata(&m), Err(TokenizerError::Gguf(GgufError::WrongType { .. }))));
    }

    #[test]
    fn bpe_merges_and_special_tokens() {
        let t = tok("smollm");
        let hello = t.token_id("hello").expect("hello");
        let w = t.token_id("Ġw").expect("Ġw");
        let o = t.token_id("o").expect("o");
        assert_eq!(t.encode("hello wo", true).expect("enc"), vec![hello, w, o]);
        // Control tokens: single ids only when parsing specials.
        assert_eq!(t.encode("<|im_start|>hello<|im_end|>", true).expect("enc"), vec![1, hello, 2]);
        let plain = t.encode("<|im_start|>", false).expect("enc");
        assert_eq!(plain.len(), "<|im_start|>".len());
        assert_eq!(t.decode(&plain, false).expect("dec"), "<|im_start|>");
        // User-defined tokens are matched either way.
        let tool = t.token_id("<tool>").expect("<tool>");
        assert_eq!(t.encode("<tool>", false).expect("enc"), vec![tool]);
        assert_eq!(t.encode("", true).expect("enc"), Vec::<u32>::new());
        assert!(t.is_special(1) && !t.is_special(tool) && !t.is_special(hello));
        assert_eq!(t.stop_ids(), &[0, 2]);
        assert!(t.is_stop(2) && !t.is_stop(1));
        assert_eq!((t.bos_id(), t.eos_id(), t.add_bos()), (Some(1), Some(2), false));
        assert_eq!(t.encode_prompt("hello").expect("enc"), vec![hello]);
    }

    #[test]
    fn digits_split_for_smollm_not_for_gpt2() {
        let t = tok("smollm");
        assert_eq!(*t.pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
        assert_eq!(t.encode("12", true).expect("enc").len(), 2);
        let g = tok("gpt-2");
        assert_eq!(*g.pre_tokenizer(), PreTokenizer::Gpt2);
        assert!(g.warnings().is_empty());
        assert_eq!(g.encode("12", true).expect("enc"), vec![g.token_id("12").expect("12")]);
        let f = tok("something-new");
        assert!(matches!(f.pre_tokenizer(), PreTokenizer::Gpt2Fallback { requested: Some(r) } if r == "something-new"));
        assert!(f.warnings()[0].contains("something-new"));
    }

    #[test]
    fn decode_round_trip_and_skip_special() {
        let t = tok("smollm");
        for s in ["héllo wörld 🚀 12", "\n\t  x", "<|im_start|>user\nhi<|im_end|>\n"] {
            let ids = t.encode(s, true).expect("enc");
            assert_eq!(t.decode(&ids, false).expect("dec"), s);
        }
        let ids = t.encode("<|im_start|>hello<|im_end|>", true).expect("enc");
        assert_eq!(t.decode(&ids, true).expect("dec"), "hello");
        assert!(matches!(t.decode(&[9999], false), Err(TokenizerError::IdOutOfRange { id: 9999, .. })));
        assert!(t.token_bytes(9999).is_none());
    }

    #[test]
    fn stream_decoder_never_splits_characters() {
        let t = tok("smollm");
        let ids = t.encode("a🚀é", true).expect("enc");
        assert_eq!(ids.len(), 1 + 4 + 2); // byte tokens only: no merges for these
        let mut d = StreamDecoder::new(true);
        let pieces: Vec<String> = ids.iter().map(|&id| d.push(&t, id).expect("push")).collect();
        assert_eq!(pieces, ["a", "", "", "", "🚀", "", "é"]);
        assert_eq!(d.pending_len(), 0);
        // A lone continuation byte can never become valid: replaced at once.
        let lone = (0..t.vocab_size() as u32).find(|&i| t.token_bytes(i) == Some(&[0x80][..])).expect("0x80");
        assert_eq!(d.push(&t, lone).expect("push"), "\u{FFFD}");
        // An unfinished character at the end comes out of finish() as U+FFFD.
        let first = ids[1];
        assert_eq!(d.push(&t, first).expect("push"), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert_eq!(d.push(&t, 1).expect("push"), ""); // control token skipped
    }

    #[test]
    fn out_of_range_special_ids_are_ignored_with_a_warning() {
        let mut m = meta("smollm");
        m.insert(KEY_PAD.into(), Value::U32(1_000_000));
        let t = Tokenizer::from_metadata(&m).expect("tokenizer");
        assert_eq!(t.pad_id(), None);
        assert!(t.warnings().iter().any(|w| w.contains(KEY_PAD)));
    }
}
