//! Draft verification in the scheduler (the engine side of VERIFIED semantic reuse), on the real
//! model: whatever drafts a request carries — its own answer, a corrupted one, several
//! candidates, garbage — the greedy output is token-for-token the output without drafts, alone
//! and in a continuous batch. Accepted tokens and the tier are reported truthfully.

mod common;

use std::sync::Arc;

use forge_cache::engine::generate::GenerateParams;
use forge_cache::engine::sampler::SamplingParams;
use forge_cache::engine::scheduler::{replay_drafts, Draft, Event, Finished, Job, Scheduler, SchedulerConfig};
use forge_cache::engine::tokenizer::Tokenizer;
use forge_cache::engine::chat::{ChatTemplate, Message};
use tokio::sync::mpsc;

struct Engine {
    sched: Scheduler,
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
}

fn engine(max_active: usize) -> Engine {
    let model = common::fast_model();
    let tok = Arc::new(Tokenizer::from_gguf(&model.gguf).expect("tokenizer"));
    let template = ChatTemplate::from_gguf(&model.gguf).expect("template").expect("chat template");
    let sched =
        Scheduler::start(Arc::new(model), tok.clone(), SchedulerConfig { queue_depth: 16, max_active, step_tokens: 64, ..SchedulerConfig::default() }).expect("start");
    Engine { sched, tok, template }
}

impl Engine {
    fn prompt(&self, question: &str) -> Vec<u32> {
        let text = self.template.render(&[Message::system("You are a helpful assistant."), Message::user(question)], true).expect("render");
        self.tok.encode_prompt(&text).expect("encode")
    }

    /// Runs a greedy request with `drafts` and checks that replaying the drafts on its answer
    /// (what the draft gate learns from when it skips drafts) counts what the engine counted.
    fn run(&self, prompt: Vec<u32>, max_tokens: usize, drafts: Vec<Draft>) -> Finished {
        let f = wait(self.submit(prompt, max_tokens, drafts.clone()));
        let mut chosen = f.tokens.clone();
        if f.stop == forge_cache::vocab::StopReason::Stop {
            chosen.push(self.tok.stop_ids()[0]);
        }
        let replay = replay_drafts(&drafts, &chosen, max_tokens, self.tok.stop_ids());
        assert_eq!(replay, (f.draft_tokens, f.draft_accepted), "replayed (fed, accepted) = the engine's, drafts {drafts:?}");
        f
    }

    fn submit(&self, prompt: Vec<u32>, max_tokens: usize, drafts: Vec<Draft>) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let params = GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop_ids: self.tok.stop_ids().to_vec() };
        self.sched.submit(Job { prompt, params, stop_strings: Vec::new(), events: tx, drafts, kv: None, tenant: String::new(), logprobs: false, score: None, late: None }).expect("submit");
        rx
    }
}

fn wait(mut rx: mpsc::UnboundedReceiver<Event>) -> Finished {
    loop {
        match rx.blocking_recv().expect("engine alive") {
            Event::Token { .. } => {}
            Event::Done(f) => return f,
            Event::Failed(e) => panic!("job failed: {e}"),
            Event::Scored(_) => panic!("a generation job ended as a scoring job"),
        }
    }
}

fn wait_scored(mut rx: mpsc::UnboundedReceiver<Event>) -> Vec<f32> {
    match rx.blocking_recv().expect("engine alive") {
        Event::Scored(s) => s.logprobs,
        other => panic!("expected a score, got {other:?}"),
    }
}

/// EQUIVALENT's check: one teacher-forced pass over prompt + answer gives, token for token, the
/// bits of the log-probabilities the decode computed (alone, and batched with other work); under
/// another prompt the same answer scores differently.
#[test]
fn scoring_an_answer_gives_the_decode_logprobs_bit_for_bit() {
    let e = engine(4);
    let prompt = e.prompt("What is the capital of France?");
    let (tx, rx) = mpsc::unbounded_channel();
    let params = GenerateParams { max_tokens: 24, sampling: SamplingParams::greedy(), stop_ids: e.tok.stop_ids().to_vec() };
    e.sched.submit(Job { prompt: prompt.clone(), params, stop_strings: Vec::new(), events: tx, drafts: Vec::new(), kv: None, tenant: String::new(), logprobs: true, score: None, late: None }).expect("submit");
    let f = wait(rx);
    let mut answer = f.tokens.clone();
    if f.stop == forge_cache::vocab::StopReason::Stop {
        answer.push(e.tok.stop_ids()[0]);
    }
    assert_eq!(f.logprobs.len(), answer.len(), "one log-probability per token, the stop included");
    assert!(f.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
    // Alone.
    let (tx, rx) = mpsc::unbounded_channel();
    e.sched.submit(Job::score(prompt.clone(), answer.clone(), e.tok.stop_ids().to_vec(), String::new(), tx)).expect("score");
    let alone = wait_scored(rx);
    assert_eq!(alone.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f.logprobs.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    // In a batch with a decoding request and another score.
    let busy = e.submit(e.prompt("Name three colors."), 16, Vec::new());
    let (tx, rx) = mpsc::unbounded_channel();
    e.sched.submit(Job::score(prompt.clone(), answer.clone(), e.tok.stop_ids().to_vec(), String::new(), tx)).expect("score");
    let (tx2, rx2) = mpsc::unbounded_channel();
    let other = e.prompt("What's the capital city of France?");
    e.sched.submit(Job::score(other, answer.clone(), e.tok.stop_ids().to_vec(), String::new(), tx2)).expect("score");
    let batched = wait_scored(rx);
    let elsewhere = wait_scored(rx2);
    wait(busy);
    assert_eq!(batched.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), f.logprobs.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(elsewhere.len(), answer.len());
    assert_ne!(elsewhere, f.logprobs, "another prompt scores the answer differently");
}

fn draft(tokens: Vec<u32>, source: i64) -> Draft {
    Draft { tokens, source, similarity: 0.9 }
}

#[test]
fn drafts_never_change_greedy_output() {
    let e = engine(4);
    let stop = e.tok.stop_ids()[0];
    let prompt = e.prompt("What is the capital of France?");
    let plain = e.run(prompt.clone(), 48, vec![]);
    assert!(plain.tokens.len() >= 3, "the answer is long enough to test: {:?}", plain.text);
    assert_eq!((plain.draft_tokens, plain.draft_accepted, plain.candidates_tried), (0, 0, 0));
    let ended = plain.stop == forge_cache::engine::generate::StopReason::Stop;
    let mut own = plain.tokens.clone();
    if ended {
        own.push(stop);
    }

    // Its own answer: every token accepted, no decode step beyond the check.
    let f = e.run(prompt.clone(), 48, vec![draft(own.clone(), 7)]);
    assert_eq!(f.tokens, plain.tokens);
    assert_eq!(f.text, plain.text);
    assert_eq!(f.draft_accepted, own.len(), "every draft token and the stop accepted");
    assert_eq!(f.served_by.as_ref().map(|d| d.source), Some(7));
    assert_eq!(f.computed, plain.computed, "the same positions are computed");
    assert!(f.decode_steps * 3 <= plain.decode_steps, "in far fewer forward calls: {} vs {}", f.decode_steps, plain.decode_steps);

    // Corrupted at index 2: two tokens accepted, then the model's own until the last three
    // generated tokens reappear in the draft, from where it is followed again — the same output.
    let mut bad = own.clone();
    bad[2] = bad[2].wrapping_add(1);
    let f = e.run(prompt.clone(), 48, vec![draft(bad.clone(), 8)]);
    assert_eq!(f.tokens, plain.tokens);
    let resync = own.len().saturating_sub(6);
    assert_eq!(f.draft_accepted, 2 + resync, "2 before the error, {resync} after re-synchronizing");
    assert!(f.served_by.is_none());
    assert_eq!(f.partial_source.as_ref().map(|d| d.source), Some(8));

    // A wrong first candidate, then one that agrees with everything: the switch happens
    // without recomputing, and the second candidate serves the answer.
    let f = e.run(prompt.clone(), 48, vec![draft(bad, 8), draft(own.clone(), 9)]);
    assert_eq!(f.tokens, plain.tokens);
    assert_eq!(f.candidates_tried, 2);
    assert_eq!(f.draft_accepted, own.len() - 1, "all but the token the first candidate got wrong");

    // Garbage, an empty draft and a too-long draft.
    let garbage: Vec<u32> = (0..40).map(|i| 1000 + i * 37).collect();
    let f = e.run(prompt.clone(), 48, vec![draft(garbage, 1), draft(vec![], 2)]);
    assert_eq!(f.tokens, plain.tokens);
    assert_eq!(f.draft_accepted, 0);
    let mut long = plain.tokens.clone();
    long.extend(std::iter::repeat_n(42, 100));
    let f = e.run(prompt.clone(), 48, vec![draft(long, 3)]);
    assert_eq!(f.tokens, plain.tokens);

    // A draft that lines up (by its last three tokens) earlier than the answer does, and runs
    // on: what is fed never passes the cache's end.
    let mut shifted = plain.tokens[5.min(plain.tokens.len())..].to_vec();
    shifted.extend(std::iter::repeat_n(42, 60));
    let f = e.run(prompt.clone(), 48, vec![draft(shifted, 5)]);
    assert_eq!(f.tokens, plain.tokens);

    // max_tokens shorter than the draft: the answer stops there, served by the draft.
    let f = e.run(prompt.clone(), 2, vec![draft(own.clone(), 4)]);
    assert_eq!(f.tokens, plain.tokens[..2]);
    assert_eq!(f.served_by.as_ref().map(|d| d.source), Some(4));
}

#[test]
fn drafts_in_a_continuous_batch_match_solo_runs() {
    let e = engine(4);
    let questions = ["What is the capital of France?", "Name three primary colors.", "What is 2 + 2?", "Who wrote Hamlet?"];
    let prompts: Vec<Vec<u32>> = questions.iter().map(|q| e.prompt(q)).collect();
    let solo: Vec<Finished> = prompts.iter().map(|p| wait(e.submit(p.clone(), 32, vec![]))).collect();
    // Everyone at once, each with another question's answer (mostly wrong) and its own
    // answer cut in half as drafts.
    let rxs: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let other = solo[(i + 1) % solo.len()].tokens.clone();
            let half = solo[i].tokens[..solo[i].tokens.len() / 2].to_vec();
            e.submit(p.clone(), 32, vec![draft(other, 1), draft(half, 2)])
        })
        .collect();
    let batched: Vec<Finished> = rxs.into_iter().map(wait).collect();
    for (i, (s, b)) in solo.iter().zip(&batched).enumerate() {
        assert_eq!(b.tokens, s.tokens, "question {i}: {:?} vs {:?}", b.text, s.text);
    }
    assert!(batched.iter().any(|b| b.peak_batch >= 2), "the requests shared forward calls");
    assert!(batched.iter().map(|b| b.draft_accepted).sum::<usize>() > 0, "some draft tokens were accepted");
}

impl Engine {
    /// As `submit`, with drafts to come late (`Scheduler::late_drafts`).
    fn submit_late(&self, prompt: Vec<u32>, max_tokens: usize) -> (mpsc::UnboundedReceiver<Event>, forge_cache::engine::scheduler::LateSender) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (late_tx, late_rx) = self.sched.late_drafts();
        let params = GenerateParams { max_tokens, sampling: SamplingParams::greedy(), stop_ids: self.tok.stop_ids().to_vec() };
        let job = Job { prompt, params, stop_strings: Vec::new(), events: tx, drafts: Vec::new(), kv: None, tenant: String::new(), logprobs: false, score: None, late: Some(late_rx) };
        self.sched.submit(job).expect("submit");
        (rx, late_tx)
    }
}

/// Drafts that come after the first token (the semantic lookup off the first token's path):
/// the first token is out before anyone looks for drafts, the output is the output without
/// drafts, and the report is what drafts given at admission give — VERIFIED for the job's own
/// answer (even when the job finished before the drafts came: it waits for them), PARTIAL for
/// one that agrees only at first, nothing accepted for garbage.
#[test]
fn late_drafts_never_delay_the_first_token_nor_change_output() {
    let e = engine(4);
    let stop = e.tok.stop_ids()[0];
    let prompt = e.prompt("What is the capital of France?");
    let plain = wait(e.submit(prompt.clone(), 48, vec![]));
    assert!(plain.tokens.len() >= 4, "the answer is long enough to test: {:?}", plain.text);
    let mut own = plain.tokens.clone();
    if plain.stop == forge_cache::vocab::StopReason::Stop {
        own.push(stop);
    }
    let late = |max_tokens: usize, tokens: Vec<u32>| {
        let (mut rx, tx) = e.submit_late(prompt.clone(), max_tokens);
        // Returns once the engine chose the first token, which it has already streamed.
        assert!(tx.wait_first(), "the job is running");
        assert!(matches!(rx.try_recv(), Ok(Event::Token { .. })), "the first token came before any draft");
        let ticket = tx.send(vec![draft(tokens, 7)]);
        let f = wait(rx);
        assert!(ticket.taken(), "the engine took the drafts");
        f
    };

    let f = late(48, own.clone());
    assert_eq!((&f.tokens, &f.text), (&plain.tokens, &plain.text));
    assert_eq!(f.draft_accepted, own.len(), "every token and the stop agreed with the draft");
    assert_eq!(f.served_by.as_ref().map(|d| d.source), Some(7));

    // Finished (one token) before the drafts came: it waits for them, and says so.
    let f = late(1, own.clone());
    assert_eq!(f.tokens, plain.tokens[..1]);
    assert_eq!((f.draft_accepted, f.served_by.as_ref().map(|d| d.source)), (1, Some(7)));

    // Agrees for two tokens, then not: PARTIAL, the same output.
    let mut bad = own.clone();
    bad[2] = bad[2].wrapping_add(1);
    let f = late(48, bad);
    assert_eq!(f.tokens, plain.tokens);
    assert!(f.served_by.is_none() && f.draft_accepted >= 2, "{f:?}");
    assert_eq!(f.partial_source.as_ref().map(|d| d.source), Some(7));

    let garbage: Vec<u32> = (0..40).map(|i| 1000 + i * 37).collect();
    let f = late(48, garbage);
    assert_eq!(f.tokens, plain.tokens);
    assert_eq!((f.draft_accepted, f.candidates_tried), (0, 1), "offered, nothing accepted");

    // No drafts at all (the lookup found nothing, or its sender was dropped).
    let (rx, tx) = e.submit_late(prompt.clone(), 48);
    drop(tx);
    let f = wait(rx);
    assert_eq!((&f.tokens, f.draft_tokens), (&plain.tokens, 0));
}
