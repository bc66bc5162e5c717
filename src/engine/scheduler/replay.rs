//! Draft bookkeeping shared by the engine and the draft gate: where a draft's fed tokens end,
//! which candidate continues after a disagreement, and [`replay_drafts`], the same bookkeeping
//! replayed on a greedy answer without running the model.

use super::{Draft, NGRAM};

/// Where a draft's tokens to feed end: at most as many as a whole answer may have, never its
/// stop token (a stop is checked, not fed).
pub(super) fn draft_end(tokens: &[u32], max_tokens: usize, stop_ids: &[u32]) -> usize {
    let end = tokens.len().min(max_tokens);
    if end > 0 && stop_ids.contains(&tokens[end - 1]) {
        end - 1
    } else {
        end
    }
}

/// After the model chose its own token (generated index `g`, the last of `gen`): a candidate
/// that agrees with everything generated so far, else one containing the last [`NGRAM`]
/// generated tokens. Returns (candidate, index of the chosen token in it).
pub(super) fn find_continuation(drafts: &[Draft], gen: &[u32], g: usize, max_tokens: usize, stop_ids: &[u32]) -> Option<(usize, usize)> {
    let end = |d: usize| draft_end(&drafts[d].tokens, max_tokens, stop_ids);
    let prefix = (0..drafts.len()).find(|&d| end(d) > g + 1 && drafts[d].tokens.starts_with(gen));
    if let Some(d) = prefix {
        return Some((d, g));
    }
    let key = gen.get(gen.len().checked_sub(NGRAM)?..)?;
    (0..drafts.len()).find_map(|d| {
        let end = end(d);
        let t = &drafts[d].tokens[..end];
        // A continuation must remain after the match.
        (NGRAM..end).find(|&i| &t[i - NGRAM..i] == key).map(|i| (d, i - 1))
    })
}

/// What verifying `drafts` would have reported (draft tokens fed, accepted) for a greedy
/// request whose answer is `chosen` (its tokens, then the stop token when it ended on one),
/// without running the model: under greedy decoding the model's choice at every position is
/// the answer's token, so the scheduler's draft bookkeeping (windows aside, which change what
/// is computed, not what is counted) can be replayed on the answer alone. This is how a
/// request that got no drafts still tells the draft gate what drafts would have done.
pub fn replay_drafts(drafts: &[Draft], chosen: &[u32], max_tokens: usize, stop_ids: &[u32]) -> (usize, usize) {
    let (mut fed, mut accepted) = (0usize, 0usize);
    if drafts.is_empty() {
        return (0, 0);
    }
    // The current draft and its alignment: draft `d` expects its token `j0 + (g - g0)` at `g`.
    let mut current: Option<(usize, usize, usize)> = Some((0, 0, 0));
    let use_draft = |d: usize, g: usize, j: usize, known: bool, fed: &mut usize| {
        let end = draft_end(&drafts[d].tokens, max_tokens, stop_ids).min(j + max_tokens.saturating_sub(g));
        *fed += end.saturating_sub(j).saturating_sub(usize::from(known));
    };
    use_draft(0, 0, 0, false, &mut fed);
    for (g, &c) in chosen.iter().enumerate() {
        let target = current.and_then(|(d, g0, j0)| drafts[d].tokens.get(j0 + (g - g0)).copied());
        let agreed = target.is_some_and(|t| t == c || (stop_ids.contains(&t) && stop_ids.contains(&c)));
        if agreed {
            accepted += 1;
        }
        // The answer's last token finished it (stop, length, stop string): nothing follows.
        if g + 1 == chosen.len() || stop_ids.contains(&c) {
            break;
        }
        if !agreed {
            match find_continuation(drafts, &chosen[..=g], g, max_tokens, stop_ids) {
                Some((d, j)) => {
                    use_draft(d, g, j, true, &mut fed);
                    current = Some((d, g, j));
                }
                None => current = None,
            }
        }
    }
    (fed, accepted)
}
