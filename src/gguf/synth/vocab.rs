//! Small, valid tokenizers for synthetic models, in the two kinds llama.cpp reads from GGUF:
//! byte-level BPE (`tokenizer.ggml.model = gpt2`, with a named pre-tokenizer) and SentencePiece
//! (`llama`, with scores and byte-fallback tokens). Both learn their merges from a built-in
//! English sample ([`SAMPLE`]) by byte-pair counting, so ordinary text tokenizes into multi-byte
//! pieces and anything else (other scripts, emoji) falls back to bytes.

use std::collections::HashMap;

use crate::gguf::Value;

/// Text the synthetic vocabularies are learned from (and prompts in tests are drawn from).
pub const SAMPLE: &str = "The quick brown fox jumps over the lazy dog. The capital of France is Paris, \
and the capital of Germany is Berlin. In 1969, the first humans walked on the Moon; they returned \
safely to the Earth. Water boils at 100 degrees Celsius at sea level. There are three states of \
matter: solid, liquid and gas. A function returns a value: def add(a, b): return a + b. \
Photosynthesis turns light, water and carbon dioxide into sugar and oxygen. The weather today is \
sunny with a light breeze from the west. She said that the meeting would start at 9:30 in the \
morning and end before noon. Numbers like 12, 345 and 6789 appear in text too. What is the answer? \
It is 42, of course! Reading books every day helps you learn new words and ideas.\n\
Questions and answers, lists and tables: one, two, three; first, second, third.\n";

/// A special token of a synthetic vocabulary: its text and GGUF token type (3 control,
/// 2 unknown, 4 user-defined).
#[derive(Debug, Clone, Copy)]
pub struct Special {
    /// The token's text.
    pub text: &'static str,
    /// GGUF token type (see above).
    pub ty: i32,
}

pub const fn control(text: &'static str) -> Special {
    Special { text, ty: 3 }
}

/// Which metadata ids point at which special token (indices into the specials list).
#[derive(Debug, Clone, Default)]
pub struct SpecialIds {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<usize>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<usize>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<usize>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<usize>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<usize>,
}

/// The GPT-2 byte-level alphabet: byte b as the character that stands for it in token texts.
pub fn byte_char(b: u8) -> char {
    let printable = |c: u8| matches!(c, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Learns up to `n` merges over `words` (each a list of symbols), most frequent pair first
/// (ties: the pair seen first). Returns the merges in order.
fn learn_merges(mut words: Vec<Vec<String>>, n: usize) -> Vec<(String, String)> {
    let mut merges = Vec::new();
    while merges.len() < n {
        let mut counts: HashMap<(String, String), (usize, usize)> = HashMap::new();
        let mut order = 0;
        for w in &words {
            for p in w.windows(2) {
                let e = counts.entry((p[0].clone(), p[1].clone())).or_insert((0, order));
                e.0 += 1;
                order += 1;
            }
        }
        let Some((pair, _)) = counts.into_iter().max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.1 .1.cmp(&a.1 .1))) else { break };
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == pair.0 && w[i + 1] == pair.1 {
                    let joined = format!("{}{}", w[i], w[i + 1]);
                    w.splice(i..i + 2, [joined]);
                }
                i += 1;
            }
        }
        merges.push(pair);
    }
    merges
}

/// Words of the sample split before each space (the space stays at the word's start).
fn sample_words() -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in SAMPLE.chars() {
        if (c == ' ' || c == '\n') && !cur.is_empty() {
            words.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    words.push(cur);
    words
}

fn ids_meta(ids: &SpecialIds) -> Vec<(String, Value)> {
    let mut m = Vec::new();
    for (key, id) in [("bos", ids.bos), ("eos", ids.eos), ("eot", ids.eot), ("unknown", ids.unk), ("padding", ids.pad)] {
        if let Some(id) = id {
            m.push((format!("tokenizer.ggml.{key}_token_id"), Value::U32(id as u32)));
        }
    }
    m
}

/// A byte-level BPE vocabulary of exactly `vocab` tokens (at least specials + 256): the specials,
/// the 256 byte symbols, then merges learned from the sample. `pre` names llama.cpp's
/// pre-tokenizer (`gpt-2`, `llama-bpe`, `qwen2`, ...).
pub fn bpe(vocab: usize, pre: &str, specials: &[Special], ids: &SpecialIds, add_bos: bool) -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = specials.iter().map(|s| s.text.to_string()).collect();
    let mut types: Vec<Value> = specials.iter().map(|s| Value::I32(s.ty)).collect();
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    types.extend((0..256).map(|_| Value::I32(1)));
    let words: Vec<Vec<String>> =
        sample_words().iter().map(|w| w.bytes().map(|b| byte_char(b).to_string()).collect()).collect();
    let merges = learn_merges(words, vocab.saturating_sub(tokens.len()));
    for (a, b) in &merges {
        tokens.push(format!("{a}{b}"));
        types.push(Value::I32(1));
    }
    // Pad with unused tokens when the sample yields fewer merges than asked for.
    while tokens.len() < vocab {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(Value::I32(5));
    }
    tokens.truncate(vocab);
    types.truncate(vocab);
    let mut m = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges.iter().map(|(a, b)| Value::String(format!("{a} {b}"))).collect())),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
    ];
    m.extend(ids_meta(ids));
    m
}

/// A SentencePiece vocabulary of exactly `vocab` tokens: the specials, the 256 `<0xXX>` byte
/// tokens, every character of the sample (spaces as `▁`), then pieces learned from it, scored by
/// merge order (earlier: higher).
pub fn spm(vocab: usize, specials: &[Special], ids: &SpecialIds, add_bos: bool, add_space_prefix: bool) -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = specials.iter().map(|s| s.text.to_string()).collect();
    let mut types: Vec<Value> = specials.iter().map(|s| Value::I32(s.ty)).collect();
    let mut scores: Vec<Value> = specials.iter().map(|_| Value::F32(0.0)).collect();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend((0..256).map(|_| Value::I32(6)));
    scores.extend((0..256).map(|_| Value::F32(0.0)));
    let escaped: Vec<Vec<String>> =
        sample_words().iter().map(|w| w.replace(' ', "\u{2581}").chars().map(|c| c.to_string()).collect()).collect();
    let mut chars: Vec<String> = escaped.iter().flatten().cloned().collect();
    chars.sort();
    chars.dedup();
    for c in chars {
        tokens.push(c);
        types.push(Value::I32(1));
        scores.push(Value::F32(-1000.0));
    }
    let merges = learn_merges(escaped, vocab.saturating_sub(tokens.len()));
    for (i, (a, b)) in merges.iter().enumerate() {
        let piece = format!("{a}{b}");
        if tokens.contains(&piece) {
            continue;
        }
        tokens.push(piece);
        types.push(Value::I32(1));
        scores.push(Value::F32(-(i as f32)));
    }
    while tokens.len() < vocab {
        tokens.push(format!("<unused{}>", tokens.len()));
        types.push(Value::I32(5));
        scores.push(Value::F32(-1e9));
    }
    tokens.truncate(vocab);
    types.truncate(vocab);
    scores.truncate(vocab);
    let mut m = vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.scores".into(), Value::Array(scores)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
        ("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(add_space_prefix)),
    ];
    m.extend(ids_meta(ids));
    m
}
