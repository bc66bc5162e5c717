//! Claims and normalized text. An answer is split into sentences (Unicode sentence boundaries,
//! UAX #29, from `unicode-segmentation`); each sentence that says something (three words or
//! more, a letter in it) is a claim. Normalized text (lower case, single spaces, no closing
//! punctuation) is the dedup key of facts and the lookup key of questions.

use unicode_segmentation::UnicodeSegmentation;

/// At most this many claims are taken from one answer.
pub const MAX_CLAIMS: usize = 32;
/// Longer claims are cut at a character boundary below this many bytes.
pub const MAX_CLAIM_BYTES: usize = 1000;
const MIN_WORDS: usize = 3;

/// The claims of an answer, in order, without repeats (by normalized text).
pub fn split_claims(answer: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for sentence in answer.split_sentence_bounds() {
        let claim = strip_marker(sentence.trim());
        if claim.split_whitespace().count() < MIN_WORDS || !claim.chars().any(char::is_alphabetic) {
            continue;
        }
        let claim = truncate(claim, MAX_CLAIM_BYTES);
        let norm = normalize(claim);
        if seen.contains(&norm) {
            continue;
        }
        seen.push(norm);
        out.push(claim.split_whitespace().collect::<Vec<_>>().join(" "));
        if out.len() == MAX_CLAIMS {
            break;
        }
    }
    out
}

/// Lower case, whitespace runs as one space, without surrounding spaces and closing
/// punctuation (`.`, `!`, `?`, `;`, `:`, `,`).
pub fn normalize(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase();
    joined.trim_end_matches(|c: char| matches!(c, '.' | '!' | '?' | ';' | ':' | ',') || c.is_whitespace()).to_string()
}

/// Leading list markers: `-`, `*`, `•`, `1.`, `2)`.
fn strip_marker(s: &str) -> &str {
    let s = s.trim_start_matches(['-', '*', '•']).trim_start();
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0 && digits <= 3 {
        if let Some(rest) = s[digits..].strip_prefix(['.', ')']) {
            return rest.trim_start();
        }
    }
    s
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_become_claims() {
        let a = "The capital of France is Paris. It is known for the Eiffel Tower! Yes. Is it big?";
        assert_eq!(split_claims(a), ["The capital of France is Paris.", "It is known for the Eiffel Tower!", "Is it big?"]);
    }

    #[test]
    fn list_markers_repeats_and_noise_are_dropped() {
        let a = "1. Paris is the capital.\n2. Paris is the capital!\n- Lyon is a big city.\n42 17 99.";
        assert_eq!(split_claims(a), ["Paris is the capital.", "Lyon is a big city."]);
        assert!(split_claims("").is_empty());
        assert!(split_claims("ok. fine.").is_empty());
    }

    #[test]
    fn normalize_ignores_case_spacing_and_closing_punctuation() {
        assert_eq!(normalize("  What is   the capital of FRANCE?  "), "what is the capital of france");
        assert_eq!(normalize("what is the capital of france"), "what is the capital of france");
        assert_eq!(normalize("Paris."), "paris");
    }

    #[test]
    fn long_claims_are_cut_on_a_char_boundary() {
        let long = format!("{} é end.", "word ".repeat(400));
        let c = split_claims(&long);
        assert_eq!(c.len(), 1);
        assert!(c[0].len() <= MAX_CLAIM_BYTES);
    }
}
