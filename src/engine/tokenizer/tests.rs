//! Tokenizer units on tiny hand-made vocabularies (the real models' ids are checked in tests/).
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
    m.insert(KEY_MODEL.into(), Value::String("t5".into()));
    let err = Tokenizer::from_metadata(&m).expect_err("must fail");
    assert!(matches!(err, TokenizerError::UnsupportedModel(ref s) if s == "t5"), "{err}");
    assert!(err.to_string().contains("\"t5\""));
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
    assert_eq!(t.pre_tokenizer().expect("bpe").regexes.len(), 2, "digits, then GPT-2");
    assert_eq!(t.encode("12", true).expect("enc").len(), 2);
    let g = tok("gpt-2");
    assert_eq!(g.pre_tokenizer().expect("bpe").regexes.len(), 1);
    assert!(g.warnings().is_empty());
    assert_eq!(g.encode("12", true).expect("enc"), vec![g.token_id("12").expect("12")]);
    // Llama 3 and Qwen2 keep digits in runs of up to 3 / split them one by one.
    assert_eq!(tok("llama-bpe").encode("12", true).expect("enc"), vec![g.token_id("12").expect("12")]);
    assert_eq!(tok("qwen2").encode("12", true).expect("enc").len(), 2);
    let f = tok("something-new");
    let pre = f.pre_tokenizer().expect("bpe");
    assert!(pre.fallback && pre.name.as_deref() == Some("something-new"));
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

#[test]
fn pre_tokenizers_split_as_llama_cpp_regexes() {
    // llama-bpe: contractions, letters with one leading non-letter, digits by 3, newlines apart.
    let cases = [
        ("llama-bpe", "I'll pay 12345 dollars!\n\nOK", vec!["I", "'ll", " pay", " ", "123", "45", " dollars", "!\n\n", "OK"]),
        ("qwen2", "x 2024", vec!["x", " ", "2", "0", "2", "4"]),
        ("gpt-2", "a  b", vec!["a", " ", " b"]),
    ];
    for (pre, text, want) in cases {
        let t = tok(pre);
        let pt = t.inner().expect("bpe").get_pre_tokenizer().expect("pre-tokenizer");
        let mut s = tokenizers::PreTokenizedString::from(text);
        tokenizers::PreTokenizer::pre_tokenize(pt, &mut s).expect("pre-tokenize");
        let pieces: Vec<String> = s
            .get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect();
        assert_eq!(pieces, want, "{pre}");
    }
}

/// A SentencePiece vocabulary: <unk> <s> </s>, two user tokens, byte tokens, pieces with scores.
fn spm_meta(add_space_prefix: bool) -> BTreeMap<String, Value> {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<start_of_turn>"].map(String::from).to_vec();
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3), Value::I32(3)];
    let mut scores = vec![Value::F32(0.0); 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(Value::I32(6));
        scores.push(Value::F32(0.0));
    }
    // Merges by score: "ab" (-1) beats "bc" (-2); "▁ab" (-3); "abc" is a token too (-0.5) but
    // only reachable from "ab" + "c".
    for (p, sc) in [("\u{2581}", -10.0), ("a", -10.0), ("b", -10.0), ("c", -10.0), ("ab", -1.0), ("bc", -2.0), ("\u{2581}ab", -3.0), ("abc", -0.5)] {
        tokens.push(p.to_string());
        types.push(Value::I32(1));
        scores.push(Value::F32(sc));
    }
    let mut m = BTreeMap::new();
    m.insert(KEY_MODEL.into(), Value::String("llama".into()));
    m.insert(KEY_TOKENS.into(), Value::Array(tokens.into_iter().map(Value::String).collect()));
    m.insert(KEY_TOKEN_TYPE.into(), Value::Array(types));
    m.insert(KEY_SCORES.into(), Value::Array(scores));
    m.insert(KEY_ADD_SPACE_PREFIX.into(), Value::Bool(add_space_prefix));
    m
}

#[test]
fn sentencepiece_merges_by_score_with_byte_fallback() {
    let t = Tokenizer::from_metadata(&spm_meta(false)).expect("spm");
    assert_eq!(t.model_name(), "llama");
    let id = |s: &str| t.token_id(s).unwrap_or_else(|| panic!("{s}"));
    // "abc": "ab" (-1) merges before "bc" (-2), then "ab"+"c" = "abc".
    assert_eq!(t.encode("abc", false).expect("enc"), vec![id("abc")]);
    // "bca": only "bc" is a token among its pairs.
    assert_eq!(t.encode("bca", false).expect("enc"), vec![id("bc"), id("a")]);
    // A space becomes ▁; "▁ab" is a token.
    assert_eq!(t.encode("c ab", false).expect("enc"), vec![id("c"), id("\u{2581}ab")]);
    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    assert_eq!(t.encode("é", false).expect("enc"), vec![id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(t.decode(&t.encode("c ab é", false).expect("enc"), false).expect("dec"), "c ab é");
    // Defaults: BOS 1, EOS 2, unknown 0, BOS added.
    assert_eq!((t.bos_id(), t.eos_id(), t.unk_id(), t.add_bos()), (Some(1), Some(2), Some(0), true));
    assert_eq!(t.encode_prompt("ab").expect("enc"), vec![1, id("ab")]);
    // A prompt that starts with the BOS text gets one BOS.
    assert_eq!(t.encode_prompt("<s>ab").expect("enc"), vec![1, id("ab")]);
}

#[test]
fn sentencepiece_space_prefix_at_start_and_after_specials() {
    let t = Tokenizer::from_metadata(&spm_meta(true)).expect("spm");
    let id = |s: &str| t.token_id(s).unwrap_or_else(|| panic!("{s}"));
    assert_eq!(t.encode("ab", false).expect("enc"), vec![id("\u{2581}ab")]);
    // After a special token the next text gets the prefix again; not without specials parsed.
    assert_eq!(t.encode("ab<start_of_turn>ab", true).expect("enc"), vec![id("\u{2581}ab"), 3, id("\u{2581}ab")]);
    let plain = t.encode("ab<start_of_turn>", false).expect("enc");
    assert_eq!(plain[0], id("\u{2581}ab"));
    assert!(!plain.contains(&3));
    let no_prefix = Tokenizer::from_metadata(&spm_meta(false)).expect("spm");
    assert_eq!(no_prefix.encode("ab", false).expect("enc"), vec![id("ab")]);
}

#[test]
fn phi3_specials_strip_the_whitespace_after_them() {
    let mut m = spm_meta(true);
    let t = Tokenizer::from_metadata(&m).expect("spm");
    let plain = t.encode("<start_of_turn>\n ab", true).expect("enc");
    m.insert("general.name".into(), Value::String("Phi 3 mini (PHI3)".into()));
    let phi = Tokenizer::from_metadata(&m).expect("spm");
    let id = |s: &str| phi.token_id(s).unwrap_or_else(|| panic!("{s}"));
    assert_eq!(phi.encode("<start_of_turn>\n ab", true).expect("enc"), vec![3, id("\u{2581}ab")]);
    assert_ne!(plain, vec![3, id("\u{2581}ab")], "without the name the whitespace is text");
    // <s> is exempt.
    assert_eq!(phi.encode("<s> ab", true).expect("enc")[..2], [1, id("\u{2581}")]);
}
