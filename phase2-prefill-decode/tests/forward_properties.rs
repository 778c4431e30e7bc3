//! Properties of the paged forward pass on a small random model: how the work is cut and laid
//! out in pages must not change the numbers. Whole prefill == two pieces == token by token;
//! a batch == each sequence alone; any page size == one big page.

mod common;

use common::{rel_error, small_model};
use phase1::{BlockTable, KvPool};
use phase2::{CpuRunner, ForwardBatch, ForwardSeq, ModelRunner, SampleSpec};
use proptest::prelude::*;

const TOL: f32 = 1e-4;

/// Runs `pieces` of `prompt` through the runner one step each (the last samples) and returns
/// the final logits.
fn run_pieces(
    runner: &mut CpuRunner,
    pool: &mut KvPool,
    prompt: &[u32],
    cuts: &[usize],
) -> Vec<f32> {
    let mut table = BlockTable::new();
    let mut start = 0;
    let mut logits = Vec::new();
    let mut bounds: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|&c| c > 0 && c < prompt.len())
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds.push(prompt.len());
    for end in bounds {
        table.append_tokens(pool, end - start).unwrap();
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                seq_id: 1,
                tokens: prompt[start..end].to_vec(),
                start_pos: start,
                kv: vec![table.clone()],
                sample: (end == prompt.len()).then(SampleSpec::greedy),
            }],
        };
        logits = runner.forward(&batch).unwrap().data;
        start = end;
    }
    table.release(pool).unwrap();
    logits
}

fn prompt_strategy() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..300, 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn whole_equals_pieces_equals_token_by_token(prompt in prompt_strategy(), cut in 0usize..40, page_size in 1usize..9) {
        let mut pool = KvPool::new(64, page_size).unwrap();
        let mut runner = CpuRunner::new(small_model(1), 64, page_size);
        let whole = run_pieces(&mut runner, &mut pool, &prompt, &[]);
        let two = run_pieces(&mut runner, &mut pool, &prompt, &[cut]);
        let each: Vec<usize> = (1..prompt.len()).collect();
        let one_by_one = run_pieces(&mut runner, &mut pool, &prompt, &each);
        prop_assert!(rel_error(&two, &whole) < TOL, "two pieces: {}", rel_error(&two, &whole));
        prop_assert!(rel_error(&one_by_one, &whole) < TOL, "token by token: {}", rel_error(&one_by_one, &whole));
    }

    #[test]
    fn any_page_size_equals_one_big_page(prompt in prompt_strategy(), page_size in 1usize..9) {
        let mut big_pool = KvPool::new(1, 64).unwrap();
        let mut big = CpuRunner::new(small_model(2), 1, 64);
        let expected = run_pieces(&mut big, &mut big_pool, &prompt, &[]);
        let mut pool = KvPool::new(64, page_size).unwrap();
        // Take some pages first so the sequence's pages are not 0, 1, 2, ...
        let _hole = pool.allocate_many(3).unwrap();
        let mut runner = CpuRunner::new(small_model(2), 64, page_size);
        let got = run_pieces(&mut runner, &mut pool, &prompt, &[prompt.len() / 2]);
        prop_assert!(rel_error(&got, &expected) < TOL);
    }

    #[test]
    fn a_batch_equals_each_sequence_alone(
        prompts in prop::collection::vec((prompt_strategy(), 0usize..40), 1..5),
        page_size in 1usize..9,
    ) {
        // Each sequence's history is prefilled alone; then one step runs all of them together:
        // a remaining prompt piece (prefill) or one token (decode).
        let mut pool = KvPool::new(256, page_size).unwrap();
        let mut runner = CpuRunner::new(small_model(3), 256, page_size);
        let mut seqs = Vec::new();
        for (i, (prompt, cut)) in prompts.iter().enumerate() {
            let done = (*cut).min(prompt.len() - 1);
            let mut table = BlockTable::new();
            if done > 0 {
                table.append_tokens(&mut pool, done).unwrap();
                let warm = ForwardBatch {
                    seqs: vec![ForwardSeq { seq_id: i as u64, tokens: prompt[..done].to_vec(), start_pos: 0, kv: vec![table.clone()], sample: None }],
                };
                runner.forward(&warm).unwrap();
            }
            table.append_tokens(&mut pool, prompt.len() - done).unwrap();
            seqs.push(ForwardSeq {
                seq_id: i as u64,
                tokens: prompt[done..].to_vec(),
                start_pos: done,
                kv: vec![table],
                sample: Some(SampleSpec::greedy()),
            });
        }
        let together = runner.forward(&ForwardBatch { seqs: seqs.clone() }).unwrap();
        for (i, seq) in seqs.into_iter().enumerate() {
            let alone = runner.forward(&ForwardBatch { seqs: vec![seq] }).unwrap();
            let err = rel_error(together.row(i), alone.row(0));
            prop_assert!(err < TOL, "sequence {} differs in a batch: {}", i, err);
        }
    }
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let mut pool = KvPool::new(4, 4).unwrap();
    let mut runner = CpuRunner::new(small_model(5), 4, 4);
    let mut table = BlockTable::new();
    table.append_tokens(&mut pool, 3).unwrap();
    let seq = ForwardSeq {
        seq_id: 7,
        tokens: vec![1, 2, 3],
        start_pos: 0,
        kv: vec![table.clone()],
        sample: None,
    };
    let check = |runner: &mut CpuRunner, seq: ForwardSeq, expect: &str| {
        let err = runner
            .forward(&ForwardBatch { seqs: vec![seq] })
            .unwrap_err()
            .to_string();
        assert!(err.contains(expect), "{err:?} should mention {expect:?}");
    };
    check(
        &mut runner,
        ForwardSeq {
            start_pos: 1,
            ..seq.clone()
        },
        "expected 4",
    );
    check(
        &mut runner,
        ForwardSeq {
            tokens: vec![1, 2, 999],
            ..seq.clone()
        },
        "outside the vocabulary",
    );
    check(
        &mut runner,
        ForwardSeq {
            kv: vec![BlockTable::from_pages(vec![9], 3)],
            ..seq.clone()
        },
        "page 9",
    );
    check(
        &mut runner,
        ForwardSeq {
            kv: vec![],
            ..seq.clone()
        },
        "no KV segment",
    );
    let long = ForwardSeq {
        tokens: vec![1; 600],
        kv: vec![BlockTable::from_pages(vec![0; 150], 600)],
        ..seq
    };
    check(&mut runner, long, "beyond the model's 512");
}
