//! The radix cache inside the chapter 3 scheduler: requests that share prefixes reuse pages,
//! prefill only their suffix, and produce exactly the tokens they produce without a cache.

use std::collections::BTreeMap;

use phase0::{Request, SamplingParams, SeqId, Sequence, TokenId};
use phase1::KvPool;
use phase2::{HashRunner, SeqState};
use phase3::{ChunkedPrefillConfig, ChunkedScheduler, PrefixCache};
use phase4::RadixCache;
use proptest::prelude::*;

const VOCAB: usize = 500;

fn request(id: SeqId, prompt: Vec<TokenId>, max_tokens: usize) -> SeqState {
    let params = SamplingParams::greedy().with_max_tokens(max_tokens);
    SeqState::new(Sequence::new(Request::new(id, prompt, params)).unwrap(), id)
}

fn config(chunk_size: usize) -> ChunkedPrefillConfig {
    ChunkedPrefillConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        chunk_size,
    }
}

/// Runs the requests in waves (a wave starts when the previous one finished, so later waves
/// can hit what earlier ones cached). Returns outputs and prefill tokens computed.
fn run_waves<C: PrefixCache>(
    s: &mut ChunkedScheduler<C>,
    runner: &mut HashRunner,
    waves: &[Vec<SeqState>],
) -> (BTreeMap<SeqId, Vec<TokenId>>, usize) {
    let mut outputs = BTreeMap::new();
    let mut prefill_tokens = 0;
    for wave in waves {
        for r in wave {
            s.add(r.clone());
        }
        while s.has_work() {
            let out = s.step(runner).unwrap();
            prefill_tokens += out.plan.num_prefill_tokens();
            for f in out.finished {
                outputs.insert(f.id(), f.seq.output().to_vec());
            }
        }
    }
    (outputs, prefill_tokens)
}

fn system_prompt(n: usize, salt: u32) -> Vec<TokenId> {
    (0..n as u32).map(|i| (i * 13 + salt) % 400).collect()
}

#[test]
fn scripted_workload_tree_and_stats() {
    let page_size = 4;
    let mut s = ChunkedScheduler::with_cache(
        KvPool::new(128, page_size).unwrap(),
        config(16),
        vec![],
        RadixCache::new(page_size),
    );
    let mut runner = HashRunner::new(128, page_size, VOCAB);
    let sys_a = system_prompt(10, 1);
    let sys_b = system_prompt(6, 2);
    let prompt = |sys: &[TokenId], q: &[TokenId]| [sys, q].concat();
    let waves = vec![
        vec![request(1, prompt(&sys_a, &[401, 402, 403]), 2)],
        vec![
            request(2, prompt(&sys_a, &[404, 405]), 2),
            request(3, prompt(&sys_b, &[406, 407, 408, 409, 410]), 2),
        ],
        vec![request(4, prompt(&sys_b, &[406, 407, 411]), 2)],
    ];
    let (outputs, _) = run_waves(&mut s, &mut runner, &waves);
    assert_eq!(outputs.len(), 4);
    let report = format!("{}\n{}", s.cache.tree(), s.cache.stats());
    insta::assert_snapshot!(report);
    let held = s.cache.stats().pages_held as usize;
    assert_eq!(
        s.pool.num_used(),
        held,
        "only the cache holds pages once all finished"
    );
    s.cache.clear(&mut s.pool);
    assert_eq!(s.pool.num_free(), 128);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn cache_changes_no_token_and_saves_prefill(
        systems in prop::collection::vec(4usize..40, 1..4),
        requests in prop::collection::vec((0usize..4, 1usize..12, 1usize..6), 2..12),
        page_size in 1usize..6,
        chunk in 3usize..32,
    ) {
        let sys: Vec<Vec<TokenId>> = systems
            .iter()
            .enumerate()
            .map(|(i, &n)| system_prompt(n, i as u32))
            .collect();
        let reqs: Vec<SeqState> = requests
            .iter()
            .enumerate()
            .map(|(i, &(which, q, out))| {
                let mut p = sys[which % sys.len()].clone();
                p.extend((0..q as u32).map(|j| 450 + (j + i as u32) % 40));
                request(i as SeqId + 1, p, out)
            })
            .collect();
        // Room for 8 running sequences of at most 57 tokens (no preemption before chapter 5),
        // and little more: the cache must evict to admit new prompts.
        let pages = 8 * (57usize.div_ceil(page_size) + 1);
        // Two waves: the second can hit the first's prefixes.
        let half = reqs.len() / 2;
        let waves = vec![reqs[..half].to_vec(), reqs[half..].to_vec()];

        let mut plain = ChunkedScheduler::new(KvPool::new(pages, page_size).unwrap(), config(chunk), vec![]);
        let mut runner = HashRunner::new(pages, page_size, VOCAB);
        let (expected, plain_prefill) = run_waves(&mut plain, &mut runner, &waves);

        let mut cached = ChunkedScheduler::with_cache(
            KvPool::new(pages, page_size).unwrap(),
            config(chunk),
            vec![],
            RadixCache::new(page_size),
        );
        let mut runner = HashRunner::new(pages, page_size, VOCAB);
        let (got, cached_prefill) = run_waves(&mut cached, &mut runner, &waves);

        prop_assert_eq!(&got, &expected);
        let stats = cached.cache.stats();
        prop_assert_eq!(plain_prefill - cached_prefill, stats.hit_tokens as usize);
        cached.cache.clear(&mut cached.pool);
        prop_assert_eq!(cached.pool.num_free(), pages, "no page leaked");
    }
}
