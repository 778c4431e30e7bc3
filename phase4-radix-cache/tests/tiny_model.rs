//! The radix cache on the real embedded model: requests that hit the cache produce exactly the
//! greedy tokens they produce without it.

use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::{CpuRunner, Model, SeqState, Tokenizer};
use phase3::{ChunkedPrefillConfig, ChunkedScheduler, PrefixCache};
use phase4::RadixCache;

fn outputs<C: PrefixCache>(
    s: &mut ChunkedScheduler<C>,
    model: &Model,
    prompts: &[Vec<u32>],
) -> Vec<Vec<u32>> {
    let mut runner = CpuRunner::new(model.clone(), 128, 4);
    let mut out = Vec::new();
    // One at a time, so that every request after the first can hit what came before.
    for (i, p) in prompts.iter().enumerate() {
        let params = SamplingParams::greedy().with_max_tokens(6);
        s.add(SeqState::new(
            Sequence::new(Request::new(i as u64, p.clone(), params)).unwrap(),
            0,
        ));
        while s.has_work() {
            out.extend(
                s.step(&mut runner)
                    .unwrap()
                    .finished
                    .into_iter()
                    .map(|f| f.seq.output().to_vec()),
            );
        }
    }
    out
}

#[test]
fn cached_prefixes_change_no_token() {
    let dir = phase2::default_model_dir();
    let model = Model::load(&dir).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let system = "KING HENRY:\nOnce more unto the breach, dear friends, once more;\n";
    let prompts: Vec<Vec<u32>> = [
        "FLUELLEN:\nUp to the breach",
        "PISTOL:\nThe knocks are",
        "NYM:\nPray thee",
    ]
    .iter()
    .map(|q| tok.encode(&format!("{system}{q}")).unwrap())
    .collect();
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: 512,
        max_num_seqs: 4,
        chunk_size: 512,
    };
    let mut plain = ChunkedScheduler::new(KvPool::new(128, 4).unwrap(), config, vec![]);
    let mut cached = ChunkedScheduler::with_cache(
        KvPool::new(128, 4).unwrap(),
        config,
        vec![],
        RadixCache::new(4),
    );
    assert_eq!(
        outputs(&mut cached, &model, &prompts),
        outputs(&mut plain, &model, &prompts)
    );
    let stats = cached.cache.stats();
    assert!(
        stats.hit_tokens >= 2 * 16,
        "the shared system prompt was hit: {stats}"
    );
}
