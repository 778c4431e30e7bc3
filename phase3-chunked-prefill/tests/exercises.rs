//! The chapter 3 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase3 --features exercises --test exercises [module]`.
//!
//! The chunk policies are compared with the chapter's round robin on the same arrivals: the
//! round robin is the real `ChunkedPrefillManager`; a policy runs in a loop that hands it the
//! prompts in progress each step and checks every plan it returns.

use phase0::{Request, SamplingParams, SeqId, Sequence};
use phase1::KvPool;
use phase2::SeqState;
use phase3::exercises::InProgress;
use phase3::exercises::fair_share::fair_share;
use phase3::exercises::shortest_first::shortest_first;
use phase3::exercises::step_cost::StepCost;
use phase3::{ChunkedPrefillConfig, ChunkedPrefillManager, NoPrefixCache, PrefillChunk};
use proptest::prelude::*;

type Policy = fn(&[InProgress], usize, usize) -> Vec<PrefillChunk>;

/// `(arrival step, prompt length)` of each request, by index.
type Arrivals = [(usize, usize)];

/// The step at which each prompt's prefill completed (its first token), under round robin.
fn round_robin(arrivals: &Arrivals, budget: usize, chunk_size: usize) -> Vec<usize> {
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: 1024,
        chunk_size,
    };
    let mut manager = ChunkedPrefillManager::new(config);
    let mut pool = KvPool::new(1 << 16, 16).unwrap();
    let mut done = vec![None; arrivals.len()];
    let mut step = 0;
    while done.iter().any(Option::is_none) {
        for (i, _) in arrivals.iter().enumerate().filter(|(_, a)| a.0 == step) {
            let prompt = vec![1; arrivals[i].1];
            let seq = Sequence::new(Request::new(i as SeqId, prompt, SamplingParams::greedy()));
            manager.add(SeqState::new(seq.unwrap(), 0));
        }
        let chunks = manager.schedule(&mut pool, &mut NoPrefixCache, 0, true);
        for mut state in manager.complete(&chunks) {
            done[state.id() as usize] = Some(step);
            state.release(&mut pool).unwrap();
        }
        step += 1;
        assert!(step < 100_000, "round robin made no progress");
    }
    done.into_iter().map(Option::unwrap).collect()
}

/// The same under `policy`, checking each plan: chunks of prompts in progress only, each
/// within its cap, all within the budget, and no step left idle while work is waiting.
fn with_policy(
    arrivals: &Arrivals,
    budget: usize,
    chunk_size: usize,
    policy: Policy,
) -> Vec<usize> {
    let mut in_progress: Vec<InProgress> = Vec::new();
    let mut done = vec![None; arrivals.len()];
    let mut step = 0;
    while done.iter().any(Option::is_none) {
        for (i, a) in arrivals.iter().enumerate().filter(|(_, a)| a.0 == step) {
            in_progress.push(InProgress {
                seq_id: i as SeqId,
                remaining: a.1,
            });
        }
        let chunks = policy(&in_progress, budget, chunk_size);
        check_plan(&in_progress, &chunks, budget, chunk_size);
        assert!(
            in_progress.is_empty() || !chunks.is_empty(),
            "step {step}: prompts wait and nothing was scheduled"
        );
        for c in &chunks {
            let p = in_progress
                .iter_mut()
                .find(|p| p.seq_id == c.seq_id)
                .unwrap();
            p.remaining -= c.num_tokens;
            if p.remaining == 0 {
                done[c.seq_id as usize] = Some(step);
            }
        }
        in_progress.retain(|p| p.remaining > 0);
        step += 1;
        assert!(step < 100_000, "the policy made no progress");
    }
    done.into_iter().map(Option::unwrap).collect()
}

fn check_plan(prompts: &[InProgress], chunks: &[PrefillChunk], budget: usize, chunk_size: usize) {
    let total: usize = chunks.iter().map(|c| c.num_tokens).sum();
    assert!(
        total <= budget,
        "{total} tokens planned, budget {budget}: {chunks:?}"
    );
    for c in chunks {
        let p = prompts
            .iter()
            .find(|p| p.seq_id == c.seq_id)
            .unwrap_or_else(|| panic!("chunk for #{}, which is not in progress", c.seq_id));
        assert!(
            c.num_tokens > 0 && c.num_tokens <= p.remaining.min(chunk_size),
            "#{} gets {} tokens with {} remaining and chunk size {chunk_size}",
            c.seq_id,
            c.num_tokens,
            p.remaining
        );
    }
    let mut ids: Vec<SeqId> = chunks.iter().map(|c| c.seq_id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        chunks.len(),
        "one chunk per prompt at most: {chunks:?}"
    );
}

/// Mean steps from arrival to first token.
fn mean_wait(arrivals: &Arrivals, done: &[usize]) -> f64 {
    let total: usize = arrivals.iter().zip(done).map(|(a, d)| d + 1 - a.0).sum();
    total as f64 / arrivals.len() as f64
}

fn prompts() -> impl Strategy<Value = Vec<InProgress>> {
    prop::collection::vec(0usize..200, 0..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, remaining)| InProgress {
                seq_id: 10 + i as SeqId,
                remaining,
            })
            .collect()
    })
}

mod shortest_first {
    use super::*;

    #[test]
    fn the_fewest_remaining_go_first() {
        let p = |seq_id, remaining| InProgress { seq_id, remaining };
        let chunks = shortest_first(&[p(1, 50), p(2, 5), p(3, 20), p(4, 5), p(5, 0)], 40, 16);
        let c = |seq_id, num_tokens| PrefillChunk { seq_id, num_tokens };
        assert_eq!(chunks, vec![c(2, 5), c(4, 5), c(3, 16), c(1, 14)]);
    }

    proptest! {
        #[test]
        fn plans_are_in_order_and_spend_the_budget(
            prompts in prompts(),
            budget in 1usize..300,
            chunk_size in 1usize..64,
        ) {
            let chunks = shortest_first(&prompts, budget, chunk_size);
            check_plan(&prompts, &chunks, budget, chunk_size);
            let remaining = |id| prompts.iter().find(|p| p.seq_id == id).unwrap().remaining;
            let keys: Vec<(usize, SeqId)> =
                chunks.iter().map(|c| (remaining(c.seq_id), c.seq_id)).collect();
            prop_assert!(keys.windows(2).all(|w| w[0] < w[1]), "not shortest first: {:?}", keys);
            let total: usize = chunks.iter().map(|c| c.num_tokens).sum();
            let wanted: usize = prompts.iter().map(|p| p.remaining.min(chunk_size)).sum();
            prop_assert_eq!(total, wanted.min(budget), "budget left unused while prompts wait");
            let short = chunks
                .iter()
                .filter(|c| c.num_tokens < remaining(c.seq_id).min(chunk_size))
                .count();
            prop_assert!(short <= 1, "more than one prompt got a cut chunk: {:?}", chunks);
        }
    }

    #[test]
    fn mean_time_to_first_token_beats_round_robin() {
        let arrivals: Vec<(usize, usize)> = [900, 40, 600, 30, 300, 50, 20, 700]
            .into_iter()
            .map(|len| (0, len))
            .collect();
        let rr = mean_wait(&arrivals, &round_robin(&arrivals, 64, 32));
        let srpf = mean_wait(&arrivals, &with_policy(&arrivals, 64, 32, shortest_first));
        assert!(
            srpf < 0.8 * rr,
            "mean steps to first token: {srpf:.1} shortest first, {rr:.1} round robin"
        );
    }

    #[test]
    fn a_stream_of_short_prompts_starves_a_long_one() {
        // A 200-token prompt, then a 32-token prompt every step for 50 steps; a step has room
        // for exactly one of those.
        let mut arrivals = vec![(0, 200)];
        arrivals.extend((1..=50).map(|step| (step, 32)));
        let rr = round_robin(&arrivals, 32, 32);
        let srpf = with_policy(&arrivals, 32, 32, shortest_first);
        assert!(
            rr[0] < 10,
            "round robin finishes the long prompt at step {}",
            rr[0]
        );
        assert!(
            srpf[0] > 50,
            "shortest first should starve the long prompt until the stream ends, it finished at step {}",
            srpf[0]
        );
    }
}

mod fair_share {
    use super::*;

    fn p(seq_id: SeqId, remaining: usize) -> InProgress {
        InProgress { seq_id, remaining }
    }

    fn sizes(chunks: &[PrefillChunk]) -> Vec<(SeqId, usize)> {
        chunks.iter().map(|c| (c.seq_id, c.num_tokens)).collect()
    }

    #[test]
    fn equal_shares_remainder_first_and_leftovers_shared_again() {
        let even = fair_share(&[p(1, 100), p(2, 100), p(3, 100)], 10, 100);
        assert_eq!(sizes(&even), vec![(1, 4), (2, 3), (3, 3)]);
        let one_short = fair_share(&[p(1, 2), p(2, 100), p(3, 100)], 10, 100);
        assert_eq!(sizes(&one_short), vec![(1, 2), (2, 4), (3, 4)]);
        let capped = fair_share(&[p(1, 100), p(2, 100)], 10, 3);
        assert_eq!(
            sizes(&capped),
            vec![(1, 3), (2, 3)],
            "chunk_size caps every share"
        );
        let scarce = fair_share(&[p(1, 9), p(2, 9), p(3, 9)], 2, 9);
        assert_eq!(
            sizes(&scarce),
            vec![(1, 1), (2, 1)],
            "prompts without a token are left out"
        );
    }

    proptest! {
        #[test]
        fn shares_are_max_min_fair_and_spend_the_budget(
            prompts in prompts(),
            budget in 1usize..300,
            chunk_size in 1usize..64,
        ) {
            let chunks = fair_share(&prompts, budget, chunk_size);
            check_plan(&prompts, &chunks, budget, chunk_size);
            let order: Vec<SeqId> = chunks.iter().map(|c| c.seq_id).collect();
            let mut sorted = order.clone();
            sorted.sort();
            prop_assert_eq!(order, sorted, "chunks come in the order of the prompts");
            let got = |id| chunks.iter().find(|c| c.seq_id == id).map_or(0, |c| c.num_tokens);
            let total: usize = chunks.iter().map(|c| c.num_tokens).sum();
            let wanted: usize = prompts.iter().map(|p| p.remaining.min(chunk_size)).sum();
            prop_assert_eq!(total, wanted.min(budget), "budget left unused while prompts wait");
            // Nobody below their cap gets more than one token less than anybody else.
            for a in &prompts {
                if got(a.seq_id) < a.remaining.min(chunk_size) {
                    for b in &prompts {
                        prop_assert!(
                            got(a.seq_id) + 1 >= got(b.seq_id),
                            "#{} got {} but #{} got {}", a.seq_id, got(a.seq_id), b.seq_id, got(b.seq_id)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn equal_prompts_finish_together_instead_of_in_turns() {
        let arrivals = vec![(0, 64); 10];
        let rr = round_robin(&arrivals, 128, 64);
        let fair = with_policy(&arrivals, 128, 64, fair_share);
        let spread = |d: &[usize]| d.iter().max().unwrap() - d.iter().min().unwrap();
        assert!(spread(&rr) >= 3, "round robin serves two a step: {rr:?}");
        assert!(
            spread(&fair) <= 1,
            "an equal split moves all of them at once: {fair:?}"
        );
        assert!(
            mean_wait(&arrivals, &fair) >= mean_wait(&arrivals, &rr),
            "the price of fairness: nobody finishes early"
        );
    }
}

mod step_cost {
    use super::*;

    #[test]
    fn points_on_a_line_give_that_line() {
        let samples: Vec<(usize, f64)> = [1, 8, 64, 512]
            .into_iter()
            .map(|t| (t, 0.002 + 0.0001 * t as f64))
            .collect();
        let fit = StepCost::fit(&samples).unwrap();
        assert!((fit.fixed - 0.002).abs() < 1e-12, "fixed {}", fit.fixed);
        assert!(
            (fit.per_token - 0.0001).abs() < 1e-12,
            "per token {}",
            fit.per_token
        );
        assert!((fit.predict(100) - 0.012).abs() < 1e-12);
    }

    #[test]
    fn one_size_fixes_no_slope() {
        assert_eq!(StepCost::fit(&[]), None);
        assert_eq!(StepCost::fit(&[(32, 0.1)]), None);
        assert_eq!(StepCost::fit(&[(32, 0.1), (32, 0.2)]), None);
    }

    #[test]
    fn noisy_measurements_give_a_close_line() {
        // Alternating +-5% noise around 5 ms + 0.2 ms per token.
        let samples: Vec<(usize, f64)> = (1..=40)
            .map(|i| {
                let t = i * 25;
                let noise = if i % 2 == 0 { 1.05 } else { 0.95 };
                (t, (0.005 + 0.0002 * t as f64) * noise)
            })
            .collect();
        let fit = StepCost::fit(&samples).unwrap();
        assert!((fit.per_token / 0.0002 - 1.0).abs() < 0.05, "{fit:?}");
    }

    #[test]
    fn the_chapter_2_measurements_give_a_chunk_for_a_100_ms_target() {
        // Prefill steps of the embedded model on a 2-core CPU (chapter 2): 128 tokens in 23 ms,
        // 4,096 in 713 ms.
        let fit = StepCost::fit(&[(128, 0.023), (4096, 0.713)]).unwrap();
        let chunk = fit.chunk_for_target(4, 0.100);
        assert!(
            (500..600).contains(&chunk),
            "with 4 decodes a 100 ms step leaves room for about 570 prompt tokens, got {chunk}"
        );
        assert_eq!(
            fit.chunk_for_target(4, 0.0001),
            0,
            "a target below the fixed cost"
        );
    }

    proptest! {
        #[test]
        fn the_chunk_is_the_largest_that_meets_the_target(
            fixed in 0.0f64..0.05,
            per_token in 1e-6f64..1e-3,
            num_decoding in 0usize..256,
            target in 0.0f64..0.5,
        ) {
            let cost = StepCost { fixed, per_token };
            let c = cost.chunk_for_target(num_decoding, target);
            if cost.predict(num_decoding) <= target {
                prop_assert!(cost.predict(num_decoding + c) <= target, "chunk {} is over the target", c);
            } else {
                prop_assert_eq!(c, 0);
            }
            prop_assert!(cost.predict(num_decoding + c + 1) > target, "chunk {} could be bigger", c);
        }
    }
}
