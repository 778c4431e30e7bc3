//! Continuous batching on the exact stand-in model: whatever the arrival order, batch limits,
//! pool size or aborts, every request gets the tokens it gets alone and every page comes back.

use std::collections::BTreeMap;

use phase0::{FinishReason, SamplingParams, SeqId, TokenId};
use phase2::HashRunner;
use phase5::{Batching, Engine, SchedulerConfig, StreamEvent};
use proptest::prelude::*;

const VOCAB: usize = 300;

#[derive(Debug, Clone)]
struct Arrival {
    step: usize,
    prompt: Vec<TokenId>,
    max_tokens: usize,
}

fn engine(pages: usize, page_size: usize, config: SchedulerConfig) -> Engine<HashRunner> {
    Engine::new(HashRunner::new(pages, page_size, VOCAB), config, vec![0], 7).unwrap()
}

fn config(max_num_seqs: usize, chunk: Option<usize>, cache: bool) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 48,
        max_num_seqs,
        chunk_size: chunk,
        enable_prefix_caching: cache,
        batching: Batching::Continuous,
        max_model_len: 4096,
    }
}

/// Runs arrivals (each at its step) to completion; outputs by arrival index.
fn run(engine: &mut Engine<HashRunner>, arrivals: &[Arrival]) -> BTreeMap<usize, Vec<TokenId>> {
    let mut ids: BTreeMap<SeqId, usize> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut step = 0;
    while ids.len() < arrivals.len() || !engine.is_finished() {
        for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.step == step) {
            let params = SamplingParams::greedy().with_max_tokens(a.max_tokens);
            ids.insert(engine.add_request(a.prompt.clone(), params).unwrap(), i);
        }
        if !engine.is_finished() {
            for f in engine.step().unwrap().finished {
                out.insert(ids[&f.id], f.output);
            }
        }
        step += 1;
        assert!(step < 20_000, "no progress");
    }
    out
}

fn arrivals() -> impl Strategy<Value = Vec<Arrival>> {
    let shared: Vec<TokenId> = (1..=12).collect();
    prop::collection::vec((0usize..12, any::<bool>(), 1usize..20, 1usize..10), 1..10).prop_map(
        move |v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (step, share, len, max_tokens))| {
                    let mut prompt = if share { shared.clone() } else { vec![] };
                    prompt.extend((0..len as u32).map(|j| 20 + (j * 3 + i as u32) % 250));
                    Arrival {
                        step,
                        prompt,
                        max_tokens,
                    }
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn batched_equals_alone_under_any_limits_and_pool(
        arrivals in arrivals(),
        max_num_seqs in 1usize..6,
        chunk in prop::option::of(2usize..16),
        cache in any::<bool>(),
        page_size in 1usize..5,
        tight in any::<bool>(),
    ) {
        // Alone: one request at a time in a roomy pool.
        let mut expected = BTreeMap::new();
        for (i, a) in arrivals.iter().enumerate() {
            let mut e = engine(256, page_size, config(1, None, false));
            let single = Arrival { step: 0, ..a.clone() };
            expected.insert(i, run(&mut e, &[single])[&0].clone());
        }
        // Together, with a pool just big enough for the longest request when `tight`: decodes
        // then run out of pages and the scheduler must preempt.
        let longest = arrivals.iter().map(|a| a.prompt.len() + a.max_tokens).max().unwrap();
        let pages = if tight { longest.div_ceil(page_size) + 1 } else { 256 };
        let mut e = engine(pages, page_size, config(max_num_seqs, chunk, cache));
        let got = run(&mut e, &arrivals);
        prop_assert_eq!(&got, &expected);
        e.scheduler_mut().clear_cache();
        prop_assert_eq!(e.scheduler().pool().num_free(), pages, "every page back");
    }
}

#[test]
fn a_tiny_pool_preempts_instead_of_failing() {
    let arrivals: Vec<Arrival> = (0..4)
        .map(|i| Arrival {
            step: 0,
            prompt: (0..6).map(|j| 10 * i + j + 1).collect(),
            max_tokens: 10,
        })
        .collect();
    let mut big = engine(64, 2, config(4, None, true));
    let expected = run(&mut big, &arrivals);
    // 16 slots for four requests that each grow to 16 tokens.
    let mut e = engine(8, 2, config(4, None, true));
    let out = run(&mut e, &arrivals);
    assert_eq!(out, expected);
    assert!(e.scheduler().num_preemptions() > 0);
}

#[test]
fn abort_frees_everything_wherever_the_request_is() {
    let mut e = engine(32, 4, config(2, Some(4), true));
    let params = SamplingParams::greedy().with_max_tokens(50);
    let a = e.add_request((1..=9).collect(), params.clone()).unwrap();
    let b = e.add_request((11..=19).collect(), params.clone()).unwrap();
    let c = e.add_request((21..=29).collect(), params).unwrap();
    e.step().unwrap(); // a and b are prefilling, c waits
    let aborted = e.abort(c).unwrap();
    assert_eq!(aborted.reason, FinishReason::Aborted);
    e.step().unwrap();
    e.step().unwrap(); // a and b are decoding
    assert_eq!(e.abort(a).unwrap().output.len(), 1);
    assert_eq!(e.abort(b).unwrap().reason, FinishReason::Aborted);
    assert!(e.abort(b).is_none(), "aborting twice finds nothing");
    assert!(e.is_finished());
    e.scheduler_mut().clear_cache();
    assert_eq!(e.scheduler().pool().num_free(), 32);
}

#[test]
fn streaming_delivers_every_token_then_the_reason_and_a_dropped_stream_aborts() {
    let mut e = engine(64, 4, config(4, None, false));
    let params = SamplingParams::greedy().with_max_tokens(5);
    let (id, rx) = e
        .add_request_streaming(vec![5, 6, 7], params.clone())
        .unwrap();
    let (_, dropped) = e.add_request_streaming(vec![8, 9], params.clone()).unwrap();
    drop(dropped);
    let done = e.run_to_completion().unwrap();
    let events: Vec<StreamEvent> = rx.try_iter().collect();
    let mine = done.iter().find(|f| f.id == id).unwrap();
    let mut expected: Vec<StreamEvent> =
        mine.output.iter().map(|&t| StreamEvent::Token(t)).collect();
    expected.push(StreamEvent::Finished(FinishReason::Length));
    assert_eq!(events, expected);
    let other = done.iter().find(|f| f.id != id).unwrap();
    assert_eq!(other.reason, FinishReason::Aborted);
    assert_eq!(
        other.output.len(),
        1,
        "stopped after the first undeliverable token"
    );
}

#[test]
fn scheduler_trace_snapshot() {
    // Three requests, one arriving mid-run, a pool small enough to preempt once.
    let mut e = engine(7, 2, config(3, Some(4), true));
    let params = |n| SamplingParams::greedy().with_max_tokens(n);
    e.add_request(vec![1, 2, 3, 4, 5], params(4)).unwrap();
    e.add_request(vec![1, 2, 3, 4, 9], params(3)).unwrap();
    let mut lines = Vec::new();
    let mut step = 0;
    while !e.is_finished() || step < 2 {
        if step == 2 {
            e.add_request(vec![7, 7, 7], params(2)).unwrap();
        }
        if !e.is_finished() {
            let out = e.step().unwrap();
            let done: Vec<String> = out
                .finished
                .iter()
                .map(|f| format!("#{} {}", f.id, f.reason))
                .collect();
            lines.push(format!(
                "{:>2}: {:<40} free {} {}",
                step,
                out.plan.to_string(),
                e.scheduler().pool().num_free(),
                if done.is_empty() {
                    String::new()
                } else {
                    format!("done: {}", done.join(", "))
                }
            ));
        }
        step += 1;
    }
    lines.push(format!(
        "preemptions: {}, cache: {}",
        e.scheduler().num_preemptions(),
        e.scheduler().cache_stats().unwrap()
    ));
    insta::assert_snapshot!(lines.join("\n"));
}

#[test]
fn bad_requests_are_refused_and_others_go_on() {
    let mut e = engine(
        4,
        4,
        SchedulerConfig {
            max_model_len: 12,
            ..config(4, None, false)
        },
    );
    assert!(e.add_request(vec![], SamplingParams::greedy()).is_err());
    let too_long = e
        .add_request(vec![1; 12], SamplingParams::greedy())
        .unwrap_err();
    assert_eq!(
        too_long.to_string(),
        "prompt of 12 tokens is longer than the limit of 11"
    );
    let bad = SamplingParams::default().with_top_p(0.0);
    assert!(e.add_request(vec![1], bad).is_err());
    let ok = e
        .add_request(vec![1, 2], SamplingParams::greedy().with_max_tokens(20))
        .unwrap();
    let done = e.run_to_completion().unwrap();
    assert_eq!(done[0].id, ok);
    assert_eq!(done[0].output.len(), 10, "stopped by max_model_len 12");
    assert_eq!(done[0].reason, FinishReason::Length);
}
