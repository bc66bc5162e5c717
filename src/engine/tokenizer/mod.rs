//! The LLM tokenizer, built from a GGUF file's `tokenizer.ggml.*` metadata so that it gives the
//! same token ids as llama.cpp.
//!
//! Two models (`tokenizer.ggml.model`):
//! * `"gpt2"` — byte-level BPE (SmolLM2, Llama 3, Qwen2/3, ...; [`bpe`]): the `tokenizers` crate's
//!   BPE and byte-level decoder behind the pre-tokenizer llama.cpp picks for `tokenizer.ggml.pre`
//!   (`llama-bpe`, `qwen2`, `smollm`, `gpt-2`, `deepseek-v3`, `tekken`, ...; an unknown name
//!   falls back to GPT-2's regex and says so: a line on stderr at load and [`Tokenizer::warnings`]);
//! * `"llama"` — SentencePiece (Llama 2, Mistral, Gemma, Phi-3; [`spm`]): llama.cpp's
//!   score-ordered pair merging with byte fallback, and its space prefix rule.
//!
//! Around both, what llama.cpp does:
//! * **special-token partitioning** — before the model the text is cut at every occurrence of a
//!   control, unknown or user-defined token (longest token text first, exactly like llama.cpp's
//!   `tokenizer_st_partition`). Control/unknown tokens are only matched when `parse_special` is
//!   true; user-defined tokens are always matched. Everything between them is plain text.
//! * **BOS / EOS** — llama.cpp's default ids per model (SentencePiece: BOS 1, EOS 2, unknown 0;
//!   BPE: 11), overridden by the file; `add_bos` from the file, else the model's default
//!   (SentencePiece and Llama 3's pre-tokenizer: yes); end of generation on EOS, EOT, EOM and the
//!   tokens llama.cpp recognizes by text (`<|im_end|>`, `<end_of_turn>`, ...).
//! * **decoding** through a per-token byte table ([`Tokenizer::token_bytes`]), so a generation loop
//!   can stream text with [`StreamDecoder`] without ever splitting a UTF-8 character.

pub mod bpe;
pub mod spm;

use std::collections::BTreeMap;

pub use self::bpe::PreTokenizer;
use self::spm::Spm;
use crate::gguf::{GgufError, GgufFile, Value};

pub const KEY_MODEL: &str = "tokenizer.ggml.model";
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
pub const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
pub const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
pub const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
pub const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// Token texts that end generation when present (besides the eos/eot/eom ids), as llama.cpp
/// finds EOT / EOG tokens by text.
const STOP_TEXTS: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>", "<EOT>", "<|return|>", "<|call|>"];

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    #[error("unsupported tokenizer model {0:?} in tokenizer.ggml.model (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)")]
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

/// The tokenizer model proper: what turns a fragment of plain text into ids.
#[derive(Clone)]
enum Model {
    Bpe { inner: tokenizers::Tokenizer, pre: PreTokenizer },
    Spm(Spm),
}

/// A piece of input after special-token partitioning (`T`: `str`, or `[u8]` for input that is
/// not valid UTF-8).
#[derive(Debug, PartialEq, Eq)]
enum Fragment<'t, T: ?Sized> {
    Text(&'t T),
    Token(u32),
}

impl<T: ?Sized> Clone for Fragment<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized> Copy for Fragment<'_, T> {}

/// Text that special tokens are searched in.
trait Haystack {
    fn len(&self) -> usize;
    fn as_bytes(&self) -> &[u8];
    fn slice(&self, r: std::ops::Range<usize>) -> &Self;
    /// Start of every non-overlapping occurrence of `needle`, leftmost first.
    fn find_all(&self, needle: &str) -> Vec<usize>;
}

impl Haystack for str {
    fn len(&self) -> usize {
        str::len(self)
    }
    fn as_bytes(&self) -> &[u8] {
        str::as_bytes(self)
    }
    fn slice(&self, r: std::ops::Range<usize>) -> &str {
        &self[r]
    }
    fn find_all(&self, needle: &str) -> Vec<usize> {
        self.match_indices(needle).map(|(i, _)| i).collect()
    }
}

impl Haystack for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn as_bytes(&self) -> &[u8] {
        self
    }
    fn slice(&self, r: std::ops::Range<usize>) -> &[u8] {
        &self[r]
    }
    fn find_all(&self, needle: &str) -> Vec<usize> {
        let n = needle.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while !n.is_empty() && i + n.len() <= self.len() {
            if &self[i..i + n.len()] == n {
                out.push(i);
                i += n.len();
            } else {
                i += 1;
            }
        }
        out
    }
}

/// A tokenizer read from GGUF metadata. Cheap to share (`Send + Sync`).
#[derive(Clone)]
pub struct Tokenizer {
    model: Model,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Bytes each token decodes to: `piece_bytes[piece_offsets[i]..piece_offsets[i + 1]]`.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<usize>,
    /// Control, unknown and user-defined tokens, longest text first (partitioning order).
    specials: Vec<u32>,
    /// Specials that swallow the whitespace after them in the input (llama.cpp's RSTRIP
    /// attribute, which it sets for models named Phi-3), sorted.
    rstrip: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    stop: Vec<u32>,
    warnings: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("model", &self.model_name())
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
        let model_name = meta_str(meta, KEY_MODEL)?.ok_or_else(|| GgufError::MissingKey(KEY_MODEL.into()))?;
        if model_name != "gpt2" && model_name != "llama" {
            return Err(TokenizerError::UnsupportedModel(model_name.to_owned()));
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

        let mut warnings = Vec::new();
        let (model, default_add_bos, defaults) = if model_name == "gpt2" {
            let merge_strs = meta_strings(meta, KEY_MERGES)?.ok_or_else(|| GgufError::MissingKey(KEY_MERGES.into()))?;
            let (pre, pre_defaults) = PreTokenizer::from_pre(meta_str(meta, KEY_PRE)?);
            if pre.fallback {
                warnings.push(format!(
                    "{KEY_PRE} = {:?} is not supported; falling back to the GPT-2 byte-level \
                     pre-tokenizer (token ids may differ from llama.cpp)",
                    pre.name
                ));
            }
            let (inner, dropped) = bpe::build(&tokens, &merge_strs, &pre)?;
            if dropped > 0 {
                warnings.push(format!("{dropped} merges name tokens missing from the vocabulary and were ignored"));
            }
            // llama.cpp's defaults for BPE vocabularies: BOS = EOS = 11.
            (Model::Bpe { inner, pre }, pre_defaults.add_bos, [Some(11), Some(11), None])
        } else {
            let scores = match meta.get(KEY_SCORES) {
                None => vec![0.0; n],
                Some(Value::Array(a)) if a.len() >= n => a
                    .iter()
                    .take(n)
                    .map(|v| v.as_f64().map(|x| x as f32))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(TokenizerError::BadMetadata { key: KEY_SCORES, msg: "non-numeric entry".into() })?,
                Some(Value::Array(a)) => return Err(TokenizerError::BadMetadata { key: KEY_SCORES, msg: format!("{} scores for {n} tokens", a.len()) }),
                Some(v) => return Err(wrong_type(KEY_SCORES, v, "array").into()),
            };
            let add_space_prefix = meta_bool(meta, KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);
            // llama.cpp's defaults for SentencePiece vocabularies: BOS 1, EOS 2, unknown 0.
            (Model::Spm(Spm::new(&tokens, scores, add_space_prefix)), true, [Some(1), Some(2), Some(0)])
        };
        // Defaults outside the vocabulary are dropped, as llama.cpp does.
        let [def_bos, def_eos, def_unk] = defaults.map(|d: Option<u32>| d.filter(|&i| (i as usize) < n));
        let mut id = |key: &'static str| meta_id(meta, key, n, &mut warnings);
        let (bos, eos, unk, pad) = (id(KEY_BOS)?.or(def_bos), id(KEY_EOS)?.or(def_eos), id(KEY_UNK)?.or(def_unk), id(KEY_PAD)?);
        let (eot, eom) = (id(KEY_EOT)?, id(KEY_EOM)?);
        let add_bos = meta_bool(meta, KEY_ADD_BOS)?.unwrap_or(default_add_bos);

        // Byte table for decoding.
        let spm = matches!(model, Model::Spm(_));
        let char_to_byte = byte_level_char_to_byte();
        let mut piece_bytes = Vec::new();
        let mut piece_offsets = Vec::with_capacity(n + 1);
        piece_offsets.push(0);
        for (text, ty) in tokens.iter().zip(&types) {
            match ty {
                // SentencePiece pieces are text with `▁` for spaces.
                TokenType::Normal if spm => {
                    for (i, part) in text.split(spm::SPACE).enumerate() {
                        if i > 0 {
                            piece_bytes.push(b' ');
                        }
                        piece_bytes.extend_from_slice(part.as_bytes());
                    }
                }
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
        let rstrip = rstrip_tokens(meta, &tokens, &specials);

        let text_id = |t: &str| match &model {
            Model::Bpe { inner, .. } => inner.token_to_id(t),
            Model::Spm(s) => s.token_id(t),
        };
        let mut stop: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        stop.extend(STOP_TEXTS.iter().filter_map(|t| text_id(t)));
        stop.sort_unstable();
        stop.dedup();

        for w in &warnings {
            tracing::warn!("tokenizer: {w}");
        }
        Ok(Tokenizer {
            model,
            tokens,
            types,
            piece_bytes,
            piece_offsets,
            specials,
            rstrip,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            stop,
            warnings,
        })
    }

    /// Token ids of `text`. With `parse_special`, control tokens written in the text (such as
    /// `<|im_start|>`) become their single ids; without it they are tokenized as plain text.
    /// User-defined tokens are matched either way. No BOS is added (see [`Tokenizer::encode_prompt`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_fragments(&self.partition(text, parse_special), text.len())
    }

    /// [`Tokenizer::encode`] of raw bytes, which need not be valid UTF-8 (llama.cpp tokenizes
    /// bytes): SentencePiece turns what is not a token into byte tokens; byte-level BPE needs
    /// valid UTF-8 between special tokens and refuses other input.
    pub fn encode_bytes(&self, text: &[u8], parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        match std::str::from_utf8(text) {
            Ok(s) => self.encode(s, parse_special),
            Err(_) => self.encode_fragments(&self.partition(text, parse_special), text.len()),
        }
    }

    fn encode_fragments<T: Haystack + ?Sized>(&self, frags: &[Fragment<'_, T>], len: usize) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::with_capacity(len / 3 + 1);
        let mut prev_special = true;
        for fragment in frags {
            match *fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let bytes = t.as_bytes();
                    match &self.model {
                        Model::Bpe { inner, .. } => {
                            let s = std::str::from_utf8(bytes)
                                .map_err(|_| TokenizerError::Unrepresentable { fragment: String::from_utf8_lossy(bytes).into_owned() })?;
                            let enc = inner.encode_fast(s, false).map_err(|e| TokenizerError::Library(e.to_string()))?;
                            let ids = enc.get_ids();
                            // The BPE model silently drops characters missing from the vocabulary; refuse instead.
                            let covered: usize = ids.iter().map(|&id| self.piece(id).map_or(0, <[u8]>::len)).sum();
                            if covered != s.len() {
                                return Err(TokenizerError::Unrepresentable { fragment: s.to_owned() });
                            }
                            out.extend_from_slice(ids);
                        }
                        // llama.cpp: a space before text at the start or right after a special token.
                        Model::Spm(spm) if spm.add_space_prefix && prev_special => spm.encode(&[b" ", bytes].concat(), &mut out)?,
                        Model::Spm(spm) => spm.encode(bytes, &mut out)?,
                    }
                    prev_special = false;
                }
            }
        }
        Ok(out)
    }

    /// A prompt as the model expects it: special tokens parsed, BOS first when the model asks for
    /// it. A prompt that already starts with the BOS text (chat templates often write
    /// `{{ bos_token }}`) gets no second one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            ids.push(bos);
        }
        ids.extend(self.encode(text, true)?);
        if ids.len() >= 2 && self.add_bos && ids[1] == ids[0] && Some(ids[0]) == self.bos {
            ids.remove(0);
        }
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

    /// The id of a token by its GGUF text (byte-level symbols: `Ġthe`, SentencePiece's `▁the`, or
    /// `<|im_end|>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.model {
            Model::Bpe { inner, .. } => inner.token_to_id(text),
            Model::Spm(s) => s.token_id(text),
        }
    }

    /// `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece), as `tokenizer.ggml.model` names them.
    pub fn model_name(&self) -> &'static str {
        match self.model {
            Model::Bpe { .. } => "gpt2",
            Model::Spm(_) => "llama",
        }
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

    /// The BPE pre-tokenizer (`None` for SentencePiece).
    pub fn pre_tokenizer(&self) -> Option<&PreTokenizer> {
        match &self.model {
            Model::Bpe { pre, .. } => Some(pre),
            Model::Spm(_) => None,
        }
    }

    /// Problems found at load that did not stop it (also printed to stderr once, at load).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The underlying `tokenizers` pipeline (BPE + pre-tokenizer + ByteLevel decoder), without
    /// the special-token handling of this type; `None` for SentencePiece.
    pub fn inner(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.model {
            Model::Bpe { inner, .. } => Some(inner),
            Model::Spm(_) => None,
        }
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
    fn partition<'t, T: Haystack + ?Sized>(&self, text: &'t T, parse_special: bool) -> Vec<Fragment<'t, T>> {
        let mut frags = if text.len() == 0 { Vec::new() } else { vec![Fragment::Text(text)] };
        for &id in &self.specials {
            if !parse_special && self.is_special(id) {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            let hits: Vec<Vec<usize>> = frags.iter().map(|f| if let Fragment::Text(s) = f { s.find_all(needle) } else { Vec::new() }).collect();
            if hits.iter().all(Vec::is_empty) {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 4);
            for (f, starts) in frags.into_iter().zip(hits) {
                let Fragment::Text(s) = f else {
                    next.push(f);
                    continue;
                };
                let mut last = 0;
                for pos in starts {
                    if pos > last {
                        next.push(Fragment::Text(s.slice(last..pos)));
                    }
                    next.push(Fragment::Token(id));
                    last = pos + needle.len();
                }
                if last < s.len() {
                    next.push(Fragment::Text(s.slice(last..s.len())));
                }
            }
            frags = next;
        }
        if !self.rstrip.is_empty() {
            // Whitespace right after an RSTRIP token is dropped (C's isspace set, as llama.cpp).
            for i in 1..frags.len() {
                if let (Fragment::Token(id), Fragment::Text(s)) = (frags[i - 1], frags[i]) {
                    if self.rstrip.binary_search(&id).is_ok() {
                        let skip = s.as_bytes().iter().take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')).count();
                        frags[i] = Fragment::Text(s.slice(skip..s.len()));
                    }
                }
            }
            frags.retain(|f| !matches!(f, Fragment::Text(s) if s.len() == 0));
        }
        frags
    }
}

/// llama.cpp's per-model token attributes that change tokenization: for a model whose
/// `general.name` contains "phi-3" or "phi3" (any case), every special token but `<unk>`, `<s>`
/// and `<|endoftext|>` (and `</s>`) strips the whitespace after it.
fn rstrip_tokens(meta: &BTreeMap<String, Value>, tokens: &[String], specials: &[u32]) -> Vec<u32> {
    let name = match meta.get("general.name") {
        Some(Value::String(s)) => s.to_lowercase(),
        _ => return Vec::new(),
    };
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return Vec::new();
    }
    let mut ids: Vec<u32> = specials.to_vec();
    ids.extend(tokens.iter().position(|t| t == "</s>").map(|i| i as u32));
    ids.retain(|&i| !["<unk>", "<s>", "<|endoftext|>"].contains(&tokens[i as usize].as_str()));
    ids.sort_unstable();
    ids.dedup();
    ids
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

fn meta_bool(meta: &BTreeMap<String, Value>, key: &str) -> Result<Option<bool>, GgufError> {
    match meta.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong_type(key, v, "bool")),
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
mod tests;
