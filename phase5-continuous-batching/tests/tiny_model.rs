//! Continuous batching on the real embedded model: batched, chunked, cached and preempted runs
//! give every request the greedy tokens it gets alone, and every page comes back.

use std::collections::BTreeMap;

use phase0::SamplingParams;
use phase2::{CpuRunner, Model, Tokenizer};
use phase5::{Batching, Engine, SchedulerConfig};
use proptest::prelude::*;

fn engine(model: &Model, pages: usize, config: SchedulerConfig) -> Engine<CpuRunner> {
    Engine::new(CpuRunner::new(model.clone(), pages, 4), config, vec![0], 1).unwrap()
}

fn config(max_num_seqs: usize, chunk_size: Option<usize>) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs,
        chunk_size,
        enable_prefix_caching: true,
        batching: Batching::Continuous,
        max_model_len: 2048,
    }
}

/// Adds requests at their arrival steps and runs to the end; outputs by request index.
fn run(
    e: &mut Engine<CpuRunner>,
    arrivals: &[(usize, Vec<u32>, usize)],
) -> BTreeMap<usize, Vec<u32>> {
    let mut index = BTreeMap::new();
    let mut out = BTreeMap::new();
    let mut step = 0;
    while index.len() < arrivals.len() || !e.is_finished() {
        for (i, (at, prompt, n)) in arrivals.iter().enumerate() {
            if *at == step {
                let params = SamplingParams::greedy()
                    .with_max_tokens(*n)
                    .with_ignore_eos(true);
                index.insert(e.add_request(prompt.clone(), params).unwrap(), i);
            }
        }
        if !e.is_finished() {
            for f in e.step().unwrap().finished {
                out.insert(index[&f.id], f.output);
            }
        }
        step += 1;
    }
    out
}

fn workload() -> Vec<(usize, Vec<u32>, usize)> {
    let dir = phase2::default_model_dir();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    [
        (0, "ROMEO:\nIs the day so young?", 10),
        (0, "ROMEO:\nIs the day so young? BENVOLIO:", 6),
        (1, "JULIET:\nWhat's in a name?", 12),
        (3, "MERCUTIO:\nA plague o' both your houses!", 8),
        (5, "KING", 9),
    ]
    .iter()
    .map(|&(at, text, n)| (at, tok.encode(text).unwrap(), n))
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]

    #[test]
    fn batched_equals_alone_and_preemption_changes_nothing(
        order in Just(workload()).prop_shuffle(),
        max_num_seqs in 1usize..5,
        chunk in prop::option::of(3usize..20),
    ) {
        let model = Model::load(&phase2::default_model_dir()).unwrap();
        let mut alone = BTreeMap::new();
        for (i, (_, prompt, n)) in order.iter().enumerate() {
            let mut e = engine(&model, 64, config(1, None));
            alone.insert(i, run(&mut e, &[(0, prompt.clone(), *n)])[&0].clone());
        }
        let mut big = engine(&model, 64, config(max_num_seqs, chunk));
        prop_assert_eq!(&run(&mut big, &order), &alone);
        // 8 pages of 4 tokens: less than the requests need together, so some are preempted.
        let mut tiny = engine(&model, 8, config(max_num_seqs, chunk));
        prop_assert_eq!(&run(&mut tiny, &order), &alone);
        tiny.scheduler_mut().clear_cache();
        prop_assert_eq!(tiny.scheduler().pool().num_free(), 8, "every page back");
    }
}
