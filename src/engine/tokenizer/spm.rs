//! SentencePiece (`tokenizer.ggml.model = llama`: Llama 2, Mistral, Gemma, Phi-3), exactly as
//! llama.cpp's `llm_tokenizer_spm_session` tokenizes: spaces become `▁`, the text splits into
//! UTF-8 characters, then the adjacent pair whose concatenation is the vocabulary token with the
//! highest score merges first (ties: leftmost), until no pair is a token; a piece that is not
//! a token is re-split along the merges that built it, down to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::TokenizerError;

/// `▁` (U+2581), SentencePiece's visible space.
pub const SPACE: &str = "\u{2581}";

/// The SentencePiece model: token scores, the text → id map and the byte tokens.
#[derive(Debug, Clone)]
pub struct Spm {
    /// Later duplicates of a text win, as in llama.cpp's map.
    text_to_id: HashMap<String, u32>,
    scores: Vec<f32>,
    /// `<0xXX>` token of each byte (or the byte's own one-character token).
    byte_ids: [Option<u32>; 256],
    /// A space before the first piece of text and after each special token (llama.cpp's
    /// `tokenizer.ggml.add_space_prefix`, true unless the file says otherwise; Gemma: false).
    pub add_space_prefix: bool,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    /// byte range of the symbol in the escaped text
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbols `left` and `right` (llama.cpp's `llm_bigram_spm`).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// The heap's top: highest score, then the leftmost.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

impl Spm {
    pub fn new(tokens: &[String], scores: Vec<f32>, add_space_prefix: bool) -> Spm {
        let text_to_id: HashMap<String, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let byte_ids = std::array::from_fn(|b| {
            text_to_id.get(&format!("<0x{b:02X}>")).or_else(|| text_to_id.get(&char::from(b as u8).to_string())).copied()
        });
        Spm { text_to_id, scores, byte_ids, add_space_prefix }
    }

    /// The id of a token text (any type), as llama.cpp's `text_to_token`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// Tokenizes one fragment of plain text (already with its leading space, if any) into `out`.
    /// The bytes need not be valid UTF-8: what is not a token becomes byte tokens.
    pub fn encode(&self, raw: &[u8], out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut text = Vec::with_capacity(raw.len() + raw.len() / 4);
        for &b in raw {
            if b == b' ' {
                text.extend_from_slice(SPACE.as_bytes());
            } else {
                text.push(b);
            }
        }
        let bytes = text.as_slice();
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let mut offs = 0;
        while offs < bytes.len() {
            let len = utf8_len(bytes[offs]).min(bytes.len() - offs);
            let i = symbols.len();
            symbols.push(Symbol { start: offs, len, prev: i.checked_sub(1), next: None });
            offs += len;
            if offs < bytes.len() {
                symbols[i].next = Some(i + 1);
            }
        }
        let mut queue = BinaryHeap::new();
        let mut rev_merge: HashMap<Vec<u8>, (usize, usize)> = HashMap::new();
        for i in 1..symbols.len() {
            self.try_bigram(bytes, &symbols, i - 1, i, &mut queue, &mut rev_merge);
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            // Skip a pair one of whose symbols has merged since.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bg.left);
            }
            if let Some(p) = symbols[bg.left].prev {
                self.try_bigram(bytes, &symbols, p, bg.left, &mut queue, &mut rev_merge);
            }
            if let Some(n) = symbols[bg.left].next {
                self.try_bigram(bytes, &symbols, bg.left, n, &mut queue, &mut rev_merge);
            }
        }
        let mut i = if symbols.is_empty() { None } else { Some(0) };
        while let Some(s) = i {
            self.resegment(bytes, &symbols, s, &rev_merge, out)?;
            i = symbols[s].next;
        }
        Ok(())
    }

    fn try_bigram(
        &self,
        text: &[u8],
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
        rev_merge: &mut HashMap<Vec<u8>, (usize, usize)>,
    ) {
        let (l, r) = (symbols[left], symbols[right]);
        let piece = &text[l.start..l.start + l.len + r.len];
        let Some(id) = self.lookup(piece) else { return };
        let Some(&score) = self.scores.get(id as usize) else { return };
        queue.push(Bigram { left, right, score, size: piece.len() });
        rev_merge.insert(piece.to_vec(), (left, right));
    }

    /// The token whose text is `piece` (never one for bytes that are not UTF-8).
    fn lookup(&self, piece: &[u8]) -> Option<u32> {
        std::str::from_utf8(piece).ok().and_then(|s| self.text_to_id.get(s).copied())
    }

    /// The token of symbol `s`, or the tokens of the two symbols it was merged from, down to bytes.
    fn resegment(&self, text: &[u8], symbols: &[Symbol], s: usize, rev_merge: &HashMap<Vec<u8>, (usize, usize)>, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let sym = symbols[s];
        let piece = &text[sym.start..sym.start + sym.len];
        if let Some(id) = self.lookup(piece) {
            out.push(id);
            return Ok(());
        }
        match rev_merge.get(piece) {
            Some(&(l, r)) => {
                self.resegment(text, symbols, l, rev_merge, out)?;
                self.resegment(text, symbols, r, rev_merge, out)
            }
            None => {
                for &b in piece {
                    let id = self.byte_ids[b as usize]
                        .ok_or_else(|| TokenizerError::Unrepresentable { fragment: String::from_utf8_lossy(piece).replace(SPACE, " ") })?;
                    out.push(id);
                }
                Ok(())
            }
        }
    }
}

/// Bytes of the UTF-8 sequence starting with `b` (llama.cpp's `unicode_len_utf8`).
fn utf8_len(b: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(b >> 4) as usize]
}
