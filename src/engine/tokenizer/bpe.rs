//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): the BPE model and byte-level decoder come from
//! the `tokenizers` crate; the pre-tokenizer is the one llama.cpp picks for the file's
//! `tokenizer.ggml.pre` (its `llm_tokenizer_bpe` regex lists, applied in order, each splitting
//! the pieces the previous one left, as `tokenizers`' `Split(Isolated)` does).

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::TokenizerError;

/// GPT-2's regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT2 and the second half of SMOLLM's), with
/// the trailing `\s+` that llama.cpp's hand-written matcher for it implies.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's regex as llama.cpp adapts it (case-insensitive contractions spelled out).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 3.5's: Qwen2's with combining marks joined to letters.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek V3's three regexes.
const DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// GPT-4o's (also Llama 4's).
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// BLOOM's (also Poro's and GPT-3 Finnish's).
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// How plain text is split before BPE: llama.cpp's pre-tokenizer for a `tokenizer.ggml.pre` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` value it was chosen for (`None`: the key is missing).
    pub name: Option<String>,
    /// Regexes applied in order (each splits the previous pieces further).
    pub regexes: Vec<&'static str>,
    /// Whether a piece that is itself a token is taken whole, without merges (llama.cpp's
    /// `ignore_merges`: Llama 3, Tekken, ...).
    pub ignore_merges: bool,
    /// Whether the name was unknown and GPT-2's regex is used as a best effort.
    pub fallback: bool,
}

/// Settings llama.cpp ties to a pre-tokenizer besides its regexes.
#[derive(Debug, Clone, Copy, Default)]
pub struct PreDefaults {
    /// add_bos when `tokenizer.ggml.add_bos_token` is missing
    pub add_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `pre` (its `tokenizer_pre` switch and regex table).
    pub fn from_pre(pre: Option<&str>) -> (PreTokenizer, PreDefaults) {
        let named = |regexes: Vec<&'static str>, ignore_merges: bool| PreTokenizer { name: pre.map(str::to_owned), regexes, ignore_merges, fallback: false };
        let mut defaults = PreDefaults::default();
        let p = match pre.unwrap_or("default") {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                defaults.add_bos = true;
                named(vec![LLAMA3], true)
            }
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => named(vec![LLAMA3], false),
            "glm4" | "glm5" => named(vec![LLAMA3], true),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan" | "solar-open" | "grok-2" => named(vec![QWEN2], false),
            "qwen35" => named(vec![QWEN35], false),
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => named(DEEPSEEK3.to_vec(), false),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => named(vec![GPT4O], false),
            "tekken" => {
                defaults.add_bos = true;
                named(vec![TEKKEN], true)
            }
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => named(vec![r"\p{N}", GPT2], false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt"
            | "olmo" | "jais" | "trillion" | "granite-docling" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => named(vec![GPT2], false),
            "bloom" | "poro-chat" | "gpt3-finnish" => named(vec![BLOOM], false),
            // llama.cpp's "default" BPE pre-tokenizer is GPT-2's regex too.
            "default" if pre.is_some() => named(vec![GPT2], false),
            _ => PreTokenizer { name: pre.map(str::to_owned), regexes: vec![GPT2], ignore_merges: false, fallback: true },
        };
        (p, defaults)
    }

    fn build(&self) -> Result<PreTokenizerWrapper, TokenizerError> {
        // Byte-level mapping without its own regex and without a prefix space (llama.cpp adds none).
        let byte_level = ByteLevel::new(false, false, false);
        let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(self.regexes.len() + 1);
        for re in &self.regexes {
            let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| TokenizerError::Library(format!("pre-tokenizer regex {re:?}: {e}")))?;
            steps.push(split.into());
        }
        steps.push(byte_level.into());
        Ok(Sequence::new(steps).into())
    }
}

/// The BPE pipeline (model, pre-tokenizer, byte-level decoder) over `tokens` and `merges`.
/// Merges naming tokens that are not in the vocabulary are dropped and counted.
pub fn build(tokens: &[String], merge_strs: &[String], pre: &PreTokenizer) -> Result<(tokenizers::Tokenizer, usize), TokenizerError> {
    // Later duplicates of a token text win, as in llama.cpp's text→id map.
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let mut merges = Vec::with_capacity(merge_strs.len());
    let mut dropped = 0usize;
    for m in merge_strs {
        // llama.cpp splits at the first space after the first byte.
        let split = m.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
        let Some(i) = split else {
            return Err(TokenizerError::BadMetadata { key: super::KEY_MERGES, msg: format!("merge {m:?} has no space") });
        };
        let (a, b) = (&m[..i], &m[i + 1..]);
        if vocab.contains_key(a) && vocab.contains_key(b) && vocab.contains_key(&format!("{a}{b}")) {
            merges.push((a.to_owned(), b.to_owned()));
        } else {
            dropped += 1;
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Library(e.to_string()))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pre.build()?));
    inner.with_decoder(Some(ByteLevel::default()));
    Ok((inner, dropped))
}
