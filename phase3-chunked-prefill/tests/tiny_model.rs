//! Chunked prefill on the real embedded model: any chunk size gives the greedy tokens of one
//! whole prefill.

use std::collections::BTreeMap;

use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::{CpuRunner, Model, SeqState, Tokenizer};
use phase3::{ChunkedPrefillConfig, ChunkedScheduler};
use proptest::prelude::*;

fn run(
    model: &Model,
    prompts: &[Vec<u32>],
    chunk_size: usize,
    page_size: usize,
) -> BTreeMap<u64, Vec<u32>> {
    let pages = 256;
    let mut runner = CpuRunner::new(model.clone(), pages, page_size);
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        chunk_size,
    };
    let mut s = ChunkedScheduler::new(KvPool::new(pages, page_size).unwrap(), config, vec![]);
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams::greedy().with_max_tokens(8);
        s.add(SeqState::new(
            Sequence::new(Request::new(i as u64, p.clone(), params)).unwrap(),
            0,
        ));
    }
    let mut out = BTreeMap::new();
    while s.has_work() {
        for f in s.step(&mut runner).unwrap().finished {
            out.insert(f.id(), f.seq.output().to_vec());
        }
    }
    assert_eq!(s.pool.num_free(), pages);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn any_chunk_size_gives_the_tokens_of_whole_prefill(chunk in 1usize..64, page_size in prop::sample::select(vec![1usize, 4, 16])) {
        let dir = phase2::default_model_dir();
        let model = Model::load(&dir).unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let prompts: Vec<Vec<u32>> = [
            "ROMEO:\nBut soft, what light through yonder window breaks?",
            "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.",
            "KING",
        ]
        .iter()
        .map(|t| tok.encode(t).unwrap())
        .collect();
        let whole = run(&model, &prompts, usize::MAX, page_size);
        prop_assert_eq!(run(&model, &prompts, chunk, page_size), whole);
    }
}
