//! No request waits behind another's long prompt (issue 16, finding 1), over real gRPC on
//! loopback with the real model: while an 8,000-token prompt is being prefilled, short greedy
//! requests of the same tenant and of another one get their first token within a second, every
//! one of them before the long prompt's first token, with the answers they get alone; a
//! 700-token prompt of a third tenant prefilled beside it also gets its answer alone (the
//! shares shift every step; batch invariance keeps every answer). Before the fair scheduler a
//! short request waited for the whole long prefill (48.8 s of 49.8 s).
//!
//! The time bounds hold on a busy machine too, each against a time taken in the same run: the
//! short requests' median time to first token is within [`ALONE_FACTOR`] of the same requests
//! alone (measured before and after the long one; the larger is the reference) plus one step
//! ([`STEP_ALLOWANCE`]), and none waits more than [`PREFILL_SHARE`] of the long prefill; while the
//! load average stays at what this test itself makes ([`LOW_LOAD`]) every one is within the
//! issue's 1 s ([`LOW_LOAD_MAX`]). (At load average
//! 10, one short request of 76 once took 3.4 s against a median of 128 ms: a per-request factor
//! over the time alone fails on such a stall of the whole machine.)
//!
//! The 8,000-token answer itself is compared with its run alone by `forge-cache bench-ttft`
//! (a second 8,000-token prefill is ~50 s more on two cores).
//!
//! The one test in this file: it uses both cores (the service's engine runs two threads).

mod common;

use std::time::{Duration, Instant};

use common::{ask, with_mode};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::server::client::Client;
use forge_cache::server::proto::{self, CacheMode};

/// SmolLM2's context is 8,192 tokens.
const LONG_TOKENS: usize = 8_000;
const MEDIUM_TOKENS: usize = 700;

/// Beside the long prefill, the short requests' median time to first token is at most this many
/// times their time alone. A fair step adds about one step (~200 ms) of waiting and shares its budget
/// with the long prompt's chunk: ~3-5x alone here; the head-of-line blocking this test is about
/// made it ~500x (48.8 s against 0.10 s).
const ALONE_FACTOR: u32 = 10;

/// Added to the [`ALONE_FACTOR`] bound: one fair step (~125 ms budget) and its overrun. A short
/// request alone takes ~35 ms on a quiet machine, so ten times that is less than the one step a
/// request admitted beside a long prefill waits by design (with 200 ms steps a quiet full-suite
/// run measured a median of 350 ms against 35 ms alone).
const STEP_ALLOWANCE: Duration = Duration::from_millis(500);

/// While the load is low, no short request waits more than this: the bound, for every
/// one of them.
const LOW_LOAD_MAX: Duration = Duration::from_secs(1);

/// No short request waits more than this share of the long prefill (same run): head-of-line
/// blocking made the first one wait nearly all of it.
const PREFILL_SHARE: f64 = 0.1;

/// The load average this test makes by itself is 2-3 (the engine's two threads and the client);
/// up to here the absolute bound of 1 s applies; above, other work shares the two cores.
const LOW_LOAD: f64 = 4.5;

/// A raw prompt of exactly `n` tokens.
fn long_prompt(tok: &Tokenizer, n: usize) -> String {
    let text = forge_cache::engine::bench::ledger_text(tok, n, 7).expect("prompt");
    assert_eq!(tok.encode_prompt(&text).expect("encode").len(), n, "the prompt has exactly {n} tokens");
    text
}

/// Sends `req` and returns (time to the first streamed token, tokens, outcome).
async fn timed(c: &mut Client, req: proto::GenerateRequest) -> (Duration, Instant, Vec<u32>, proto::Outcome) {
    let t0 = Instant::now();
    let mut stream = c.generate_stream(req).await.expect("generate");
    let (mut first, mut tokens) = (None, Vec::new());
    while let Some(m) = stream.message().await.expect("stream") {
        if !m.token_ids.is_empty() && first.is_none() {
            first = Some(Instant::now());
        }
        tokens.extend_from_slice(&m.token_ids);
        if let Some(o) = m.outcome {
            let first = first.expect("a token before the outcome");
            return (first - t0, first, tokens, o);
        }
    }
    panic!("the stream ended without an outcome");
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_requests_get_their_first_token_within_a_second_during_an_8000_token_prefill() {
    let model = common::fast_model();
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    drop(model);
    let long = proto::GenerateRequest { prompt: long_prompt(&tok, LONG_TOKENS), raw: true, max_tokens: Some(4), ..Default::default() };
    let long = with_mode(long, CacheMode::Bypass);
    let shorts = [with_mode(ask("What is 2 + 2?", 8), CacheMode::Bypass), with_mode(ask(common::FRANCE, 8), CacheMode::Bypass)];

    let medium = proto::GenerateRequest { prompt: long_prompt(&tok, MEDIUM_TOKENS), raw: true, max_tokens: Some(6), ..Default::default() };
    let medium = with_mode(medium, CacheMode::Bypass);

    let (_scratch, server, c) = common::service_with(|config, _| config.threads = 2).await;
    let (mut owner, mut other, mut third) = (c.clone().with_tenant("big"), c.clone().with_tenant("small"), c.clone().with_tenant("third"));
    let mut solo = Vec::new();
    for s in &shorts {
        solo.push(timed(&mut other, s.clone()).await);
    }
    let (_, _, medium_alone, _) = timed(&mut third, medium.clone()).await;

    // The long request, a medium one soon after, and short requests (the long one's tenant's
    // and another's) every 2 s until the long one's first token.
    let long_task = {
        let (mut c, long) = (owner.clone(), long.clone());
        tokio::spawn(async move { timed(&mut c, long).await })
    };
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let medium_task = tokio::spawn(async move { timed(&mut third, medium).await });
    let mut during = Vec::new();
    let mut load = load_average();
    while !long_task.is_finished() {
        load = load.max(load_average());
        let k = during.len();
        let client = if k % 2 == 0 { &mut other } else { &mut owner };
        let (ttft, first_at, tokens, _) = timed(client, shorts[k % 2].clone()).await;
        assert_eq!(tokens, solo[k % 2].2, "a short request's answer changed beside the long prefill");
        during.push((ttft, first_at, started.elapsed()));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (_, long_first_at, long_tokens, long_outcome) = long_task.await.expect("join");
    assert_eq!(long_outcome.prompt_token_ids.len(), LONG_TOKENS);
    assert_eq!(long_tokens.len(), 4, "the long request ends with its whole answer");
    let (_, medium_first_at, medium_tokens, _) = medium_task.await.expect("join");
    assert_eq!(medium_tokens, medium_alone, "the medium request's answer changed beside the long one");
    assert!(medium_first_at < long_first_at, "the medium prompt did not wait for the long one");
    let prefill_s = long_outcome.ttft_ms / 1e3;
    // The short requests alone again, now, in case the machine got busier during the run.
    let mut alone = Vec::new();
    for (k, s) in shorts.iter().enumerate() {
        let (ttft, _, tokens, _) = timed(&mut other, s.clone()).await;
        assert_eq!(tokens, solo[k].2);
        alone.push(ttft.max(solo[k].0));
    }

    // Shorts whose first token came before the long prompt's first token were served during
    // its prefill: there must be several, spread over it (the late part is the slowest).
    let served: Vec<(usize, &(Duration, Instant, Duration))> = during.iter().enumerate().filter(|(_, d)| d.1 < long_first_at).collect();
    let mut ttfts: Vec<Duration> = served.iter().map(|(_, d)| d.0).collect();
    ttfts.sort();
    let load = load.max(load_average());
    eprintln!(
        "long prefill {prefill_s:.1} s (alone: above); {} short requests during it, time to first token p50 {:?}, max {:?} \
         (alone, the larger of before and after: {:?} / {:?}); load average up to {load:.1}",
        ttfts.len(),
        ttfts.get(ttfts.len() / 2),
        ttfts.last(),
        alone[0],
        alone[1]
    );
    for (k, d) in &served {
        eprintln!("  short {k} (tenant {}): done {:.1} s into the long prefill, first token after {:?}", if k % 2 == 0 { "small" } else { "big" }, d.2.as_secs_f64(), d.0);
    }
    assert!(served.len() >= 3, "short requests served during the long prefill: {}", served.len());
    let last_done = served.iter().map(|(_, d)| d.2).max().unwrap_or_default();
    assert!(
        last_done.as_secs_f64() > 0.7 * prefill_s,
        "a short request was served late in the prefill (the last done at {last_done:?} of {prefill_s:.1} s)"
    );
    // Against times of this run, whatever the load: the median against the requests alone,
    // every one against the long prefill.
    let median = ttfts[ttfts.len() / 2];
    let slower_alone = alone[0].max(alone[1]);
    assert!(
        median <= slower_alone * ALONE_FACTOR + STEP_ALLOWANCE,
        "median time to first token {median:?} beside the long prefill, {slower_alone:?} alone (bound {ALONE_FACTOR}x + {STEP_ALLOWANCE:?}, load {load:.1})"
    );
    let share = Duration::from_secs_f64(PREFILL_SHARE * prefill_s);
    assert!(ttfts.iter().all(|&t| t <= share), "time to first token beside the long prefill: {ttfts:?}; bound {share:?} ({PREFILL_SHARE} of the {prefill_s:.1} s prefill; load {load:.1})");
    // One second (the bound) while only this test loads the machine; far above that,
    // other builds share the two cores and stretch the short prompt's own prefill.
    if load <= LOW_LOAD {
        assert!(median < Duration::from_secs(1), "median time to first token beside the long prefill {median:?}: {ttfts:?} (load {load:.1})");
        assert!(ttfts.iter().all(|&t| t < LOW_LOAD_MAX), "time to first token beside the long prefill: {ttfts:?} (load {load:.1})");
    } else {
        eprintln!("load average {load:.1} > {LOW_LOAD}: the absolute 1 s bound is not checked in this run (the {ALONE_FACTOR}x one is)");
    }
    server.stop().await.expect("stop");
}
