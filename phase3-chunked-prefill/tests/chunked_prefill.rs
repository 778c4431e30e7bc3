//! Chunked prefill: same tokens as whole prefill, steps within budget, fair and never
//! starving decodes. The stand-in `HashRunner` makes the token checks exact and fast.

mod common;

use common::{VOCAB, request, run_all};
use phase0::EntryKind;
use phase1::KvPool;
use phase2::HashRunner;
use phase3::{ChunkedPrefillConfig, ChunkedScheduler};
use proptest::prelude::*;

fn scheduler(budget: usize, chunk_size: usize, pages: usize, page_size: usize) -> ChunkedScheduler {
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 64,
        chunk_size,
    };
    ChunkedScheduler::new(KvPool::new(pages, page_size).unwrap(), config, vec![])
}

#[test]
fn scripted_trace() {
    // Two short requests decoding when a 20-token prompt arrives: the long prompt is cut into
    // chunks of 8 and every step keeps both decodes.
    let mut s = scheduler(10, 8, 64, 4);
    let mut runner = HashRunner::new(64, 4, VOCAB);
    s.add(request(1, 3, 6));
    s.add(request(2, 4, 6));
    let mut trace = Vec::new();
    let first = s.step(&mut runner).unwrap();
    trace.push(first.plan.to_string());
    s.add(request(3, 20, 2));
    while s.has_work() {
        trace.push(s.step(&mut runner).unwrap().plan.to_string());
    }
    insta::assert_snapshot!(trace.join("\n"));
    assert_eq!(s.pool.num_free(), 64);
}

#[test]
fn a_prompt_longer_than_the_budget_is_still_served() {
    let mut s = scheduler(16, 16, 64, 4);
    let mut runner = HashRunner::new(64, 4, VOCAB);
    s.add(request(1, 100, 3));
    let (outputs, trace) = run_all(&mut s, &mut runner);
    assert_eq!(outputs[&1].len(), 3);
    assert_eq!(trace.len(), 7 + 2, "100 tokens in 7 chunks, then 2 decodes");
}

#[test]
fn running_out_of_pages_without_preemption_is_an_error() {
    let mut s = scheduler(64, 64, 2, 4);
    let mut runner = HashRunner::new(2, 4, VOCAB);
    s.add(request(1, 7, 10));
    let err = loop {
        match s.step(&mut runner) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("out of KV pages"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn chunked_prefill_gives_the_same_tokens_as_whole_prefill(
        lens in prop::collection::vec((1usize..60, 1usize..8), 1..8),
        chunk in 1usize..40,
        page_size in 1usize..9,
    ) {
        let run = |chunk_size: usize| {
            let mut s = scheduler(64, chunk_size, 512, page_size);
            let mut runner = HashRunner::new(512, page_size, VOCAB);
            for (i, &(len, out)) in lens.iter().enumerate() {
                s.add(request(i as u64 + 1, len, out));
            }
            let (outputs, _) = run_all(&mut s, &mut runner);
            prop_assert_eq!(s.pool.num_free(), 512, "every page returned");
            Ok(outputs)
        };
        prop_assert_eq!(run(chunk)?, run(usize::MAX)?);
    }

    #[test]
    fn steps_respect_the_budget_and_nobody_starves(
        lens in prop::collection::vec((1usize..80, 1usize..6), 1..10),
        budget in 8usize..48,
        chunk in 1usize..24,
    ) {
        let mut s = scheduler(budget, chunk, 1024, 4);
        let mut runner = HashRunner::new(1024, 4, VOCAB);
        for (i, &(len, out)) in lens.iter().enumerate() {
            s.add(request(i as u64 + 1, len, out));
        }
        let n = lens.len();
        let mut last_served = vec![0usize; n + 1];
        let mut step = 0;
        while s.has_work() {
            step += 1;
            let decoding: Vec<u64> = s.decode.running().iter().map(|r| r.id()).collect();
            let prefilling: Vec<u64> = s.prefill.prefilling().map(|r| r.state.id()).collect();
            let outcome = s.step(&mut runner).unwrap();
            let plan = &outcome.plan;
            prop_assert!(plan.num_tokens() <= budget, "step {} used {} > {}", step, plan.num_tokens(), budget);
            let within_chunk = plan.entries().iter().all(|e| match e.kind {
                EntryKind::Prefill { .. } => e.num_tokens <= chunk,
                EntryKind::Decode => true,
            });
            prop_assert!(within_chunk, "a chunk over {} tokens in {}", chunk, plan);
            // Every running decode is in every step.
            for id in &decoding {
                let decoded = plan.entries().iter().any(|e| e.seq_id == *id && e.kind == EntryKind::Decode);
                prop_assert!(decoded, "decode of {} starved in {}", id, plan);
            }
            // Every prompt in progress is served within as many steps as there are prompts.
            for e in plan.entries() {
                last_served[e.seq_id as usize] = step;
            }
            for id in prefilling {
                if s.prefill.get(id).is_some() {
                    prop_assert!(step - last_served[id as usize] <= n, "prompt {} starved", id);
                }
            }
            prop_assert!(step < 10_000);
        }
        prop_assert_eq!(s.pool.num_free(), 1024);
    }
}
