//! BLEND (cache mode BLEND, opt-in and lossy): spans of a prompt whose keys and values come
//! from elsewhere, computed for the span on its own at other positions (CacheBlend, EuroSys'25).
//! The engine knows nothing of documents: a [`Blend`] is a list of [`ReusedSpan`]s, each with the
//! span's own short sequence (a few leading tokens of context, then the span) and a
//! [`PrefixCache`] that holds that sequence's KV (the workload keys it by its tokens).
//!
//! At admission ([`load`]), for a prefix cache that offers a blend:
//! 1. each span's own KV is loaded (or computed and published, the first time it is seen);
//! 2. its keys are re-rotated from the stored positions to the span's place in the prompt (RoPE
//!    by the position difference, each layer with its own base: rotations compose), values
//!    copied as they are;
//! 3. the first [`CHECK_LAYERS`] layers are computed for every token of the prompt (exact); the
//!    span tokens whose KV in the last of them deviates most from the reused one (squared
//!    difference of keys and values) are chosen, the `recompute` fraction of them;
//! 4. the layers after those run only over the tokens outside the spans and the chosen ones,
//!    each attending to the whole blended context; the other span tokens keep the reused KV.
//!
//! The prompt's last token is left to the scheduler (its logits give the first token). With
//! `recompute` = 1 every token is computed in every layer: the KV is bit for bit a full
//! prefill's (the forward pass is batch invariant), whatever was reused. Offloaded layers (KV on
//! a device) are not supported: BLEND falls back to a full prefill and says why.

use super::model::{Logits, Model, ModelError, SeqBatch};
pub use super::prefix::{Blend, BlendReport, ReusedSpan};
use super::prefix::PrefixCache;
use super::KvCache;
use super::config::RopeStyle;
use crate::backend::cpu::ops;

/// Layers computed for every prompt token; the last one's KV deviation chooses the span tokens
/// recomputed in the layers after it (layer 0's keys depend on the token alone, so the first
/// layer whose KV sees the other tokens is layer 1).
pub const CHECK_LAYERS: usize = 2;

/// Why a blend could not run (the prompt is then prefilled in full).
#[derive(Debug, thiserror::Error)]
pub enum BlendError {
    #[error("BLEND is not supported here: {0}")]
    Unsupported(String),
    #[error("a span at {at} of {len} tokens does not fit the prompt of {prompt} tokens")]
    Span { at: usize, len: usize, prompt: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// The scheduler's admission: a prefix cache that offers a blend gets its spans blended into
/// `kv` (every prompt position but the last); any other loads its prefix. Returns the positions
/// `kv` holds. A blend that cannot run leaves `kv` empty and records why (full prefill).
pub(super) fn load(model: &Model, cache: &mut dyn PrefixCache, kv: &mut KvCache, prompt: &[u32]) -> usize {
    let Some(blend) = cache.blend() else { return cache.load(kv, prompt) };
    match prefill(model, kv, prompt, blend) {
        Ok(n) => n,
        Err(why) => {
            tracing::info!(reason = %why, "BLEND falls back to a full prefill");
            blend.report = BlendReport { fallback: Some(why.to_string()), other: prompt.len(), ..BlendReport::default() };
            kv.truncate(0);
            0
        }
    }
}

/// Steps 1–4 of the module's description over `prompt[..len - 1]` into the empty `kv`; returns
/// the positions `kv` holds (all but the prompt's last) and leaves the numbers in
/// `blend.report`.
pub fn prefill(model: &Model, kv: &mut KvCache, prompt: &[u32], blend: &mut Blend) -> Result<usize, BlendError> {
    let c = &model.config;
    let n = prompt.len().saturating_sub(1);
    if model.has_offload() {
        return Err(BlendError::Unsupported("offloaded layers keep their KV on the device; BLEND needs every layer on the CPU".into()));
    }
    if c.n_layer <= CHECK_LAYERS {
        return Err(BlendError::Unsupported(format!("a model of {} layers has none after the {CHECK_LAYERS} check layers", c.n_layer)));
    }
    if !kv.is_empty() || kv.capacity < n {
        return Err(BlendError::Unsupported("the sequence's cache is not empty or too small".into()));
    }
    if n == 0 {
        return Ok(0);
    }
    let mut end = 0;
    for s in &blend.spans {
        let span = &s.tokens[s.base.min(s.tokens.len())..];
        if s.base == 0 || s.at < end || s.at < s.base || s.at + span.len() > n || prompt.get(s.at..s.at + span.len()) != Some(span) {
            return Err(BlendError::Span { at: s.at, len: span.len(), prompt: prompt.len() });
        }
        end = s.at + span.len();
    }
    let t0 = std::time::Instant::now();
    let mut state = model.new_state(n);
    let mut report = BlendReport::default();
    // 1–2: each span's own KV, re-rotated into place. A first span whose own sequence is the
    // prompt's start (its leading context is the prompt before it) is an exact prefix: its KV
    // is loaded (or computed) straight into `kv` and no layer computes its positions again.
    let mut exact = 0;
    for (i, s) in blend.spans.iter_mut().enumerate() {
        if i == 0 && s.at == s.base && prompt[..s.tokens.len()] == s.tokens[..] {
            let got = s.cache.load(kv, &s.tokens);
            if got < s.tokens.len() {
                let mut seq = [SeqBatch { kv: &mut *kv, tokens: &s.tokens[got..], logits: Logits::None }];
                model.forward(&mut state, &mut seq)?;
                s.cache.publish(kv, &s.tokens, &[]);
            }
            report.loaded += got.saturating_sub(s.base);
            report.span_computed += s.tokens.len() - got;
            report.exact = s.len();
            exact = s.tokens.len();
            continue;
        }
        let mut own = model.new_kv(s.tokens.len());
        let got = s.cache.load(&mut own, &s.tokens);
        if got < s.tokens.len() {
            let mut seq = [SeqBatch { kv: &mut own, tokens: &s.tokens[got..], logits: Logits::None }];
            model.forward(&mut state, &mut seq)?;
            s.cache.publish(&own, &s.tokens, &[]);
        }
        report.loaded += got.saturating_sub(s.base);
        report.span_computed += s.tokens.len() - got;
        place(model, &own, s.base, s.at, s.len(), kv);
    }
    let t1 = std::time::Instant::now();
    // 3: the check layers over every token after the exact prefix.
    model.embed_all(&mut state, &prompt[..n])?;
    let all: Vec<u32> = (exact as u32..n as u32).collect();
    model.keep_rows(&mut state, &all, 0);
    let last = CHECK_LAYERS - 1;
    let mut before: (Vec<half::f16>, Vec<half::f16>) = (Vec::new(), Vec::new());
    for li in 0..CHECK_LAYERS {
        if li == last {
            let (k, v) = kv.layer(li);
            before = (k.to_vec(), v.to_vec());
        }
        model.cpu_layer(li, &mut state, &mut [SeqBatch { kv: &mut *kv, tokens: &prompt[exact..n], logits: Logits::None }], n - exact);
    }
    let t2 = std::time::Instant::now();
    // Per moved span token (not in the exact prefix): its KV's deviation in the last check layer.
    let mut dev: Vec<(f32, u32)> = Vec::new();
    let mut in_span = vec![false; n];
    let edge = edge_tokens();
    let mut forced: Vec<u32> = Vec::new();
    {
        let (k, v) = kv.layer(last);
        let (heads, hd) = kv.head_shape();
        for s in &blend.spans {
            for p in s.at.max(exact)..s.at + s.len() {
                in_span[p] = true;
                if p < s.at + edge {
                    forced.push(p as u32);
                    continue;
                }
                let mut d = 0f32;
                for h in 0..heads {
                    let r = (h * kv.capacity + p) * hd..(h * kv.capacity + p + 1) * hd;
                    for (a, b) in k[r.clone()].iter().zip(&before.0[r.clone()]).chain(v[r.clone()].iter().zip(&before.1[r])) {
                        let x = a.to_f32() - b.to_f32();
                        d += x * x;
                    }
                }
                dev.push((d, p as u32));
            }
        }
    }
    drop(before);
    let moved = dev.len() + forced.len();
    let chosen = ((blend.recompute.clamp(0.0, 1.0) as f64) * moved as f64).round() as usize;
    // The first tokens of each moved span first (they lost the context they were computed
    // after), then the largest deviation; ties by position (deterministic).
    dev.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut keep = vec![false; n];
    for p in forced.iter().copied().chain(dev.iter().map(|d| d.1)).take(chosen) {
        keep[p as usize] = true;
    }
    let rows: Vec<u32> = (exact..n).filter(|&p| !in_span[p] || keep[p]).map(|p| p as u32).collect();
    let tokens: Vec<u32> = rows.iter().map(|&p| prompt[p as usize]).collect();
    // 4: the other layers over the chosen rows.
    let t3 = std::time::Instant::now();
    model.keep_rows(&mut state, &rows, exact);
    for li in CHECK_LAYERS..c.n_layer {
        model.cpu_layer(li, &mut state, &mut [SeqBatch { kv: &mut *kv, tokens: &tokens, logits: Logits::None }], rows.len());
    }
    let t4 = std::time::Instant::now();
    tracing::debug!(load_ms = (t1 - t0).as_secs_f64() * 1e3, check_ms = (t2 - t1).as_secs_f64() * 1e3,
        select_ms = (t3 - t2).as_secs_f64() * 1e3, rest_ms = (t4 - t3).as_secs_f64() * 1e3, rows = rows.len(), exact, n, "BLEND prefill");
    kv.truncate(0);
    kv.advance(n);
    let spans: usize = blend.spans.iter().map(|s| s.len()).sum();
    report.recomputed = chosen.min(moved);
    report.reused = spans - report.recomputed;
    // The lead of an exact first span came with it: not computed.
    report.other = prompt.len() - spans - (exact - report.exact);
    blend.report = report;
    Ok(n)
}

/// Leading tokens of each moved span always among the recomputed (`FORGE_BLEND_EDGE`, default
/// 0): a span's first tokens were computed right after its leading context and lost it.
fn edge_tokens() -> usize {
    std::env::var("FORGE_BLEND_EDGE").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Writes `len` positions of `own` from `base` on into `kv` at `at..` (every host layer; `at` >=
/// `base`): keys rotated by `at - base` positions with each layer's RoPE (rotations compose:
/// θ is linear in the position), values as they are.
pub fn place(model: &Model, own: &KvCache, base: usize, at: usize, len: usize, kv: &mut KvCache) {
    use half::slice::HalfFloatSliceExt;
    let c = &model.config;
    let (heads, hd) = kv.head_shape();
    let shift = at.saturating_sub(base) as u32;
    let factors = model.weights.rope_freqs.as_deref();
    let mut global = vec![0f32; hd];
    ops::rope_row(shift, c.rope_dims, c.rope_base, c.rope_freq_scale, factors, &mut global);
    let mut windowed = vec![0f32; hd];
    ops::rope_row(shift, c.rope_dims, c.rope_base_swa, 1.0, None, &mut windowed);
    let swa = model.swa_rope();
    let mut k = vec![0f32; len * hd];
    let (own_cap, cap) = (own.capacity, kv.capacity);
    for li in 0..c.n_layer {
        if !own.on_host(li) || !kv.on_host(li) {
            continue;
        }
        let cs = if swa && c.window(li).is_some() { &windowed } else { &global };
        let (sk, sv) = own.layer(li);
        let (dk, dv) = kv.layer_mut(li);
        for h in 0..heads {
            // Positions are contiguous within a head: one run of `len * hd` each side.
            let src = (h * own_cap + base) * hd..(h * own_cap + base + len) * hd;
            let dst = (h * cap + at) * hd..(h * cap + at + len) * hd;
            dv[dst.clone()].copy_from_slice(&sv[src.clone()]);
            sk[src].convert_to_f32_slice(&mut k);
            for head in k.chunks_exact_mut(hd) {
                match c.rope_style {
                    RopeStyle::Adjacent => ops::rope_head(head, cs),
                    RopeStyle::Neox => ops::rope_head_neox(head, cs, c.rope_dims),
                }
            }
            dk[dst].convert_from_f32_slice(&k);
        }
    }
}
