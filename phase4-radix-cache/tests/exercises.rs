//! The chapter 4 exercises (`src/exercises/`), one module each:
//! `cargo test -p phase4 --features exercises --test exercises [module]`.
//!
//! The workloads run through [`serve_one`], a request's life as the scheduler sees it: match
//! the prompt and lock the path, get pages for the rest (evicting when the pool is short),
//! insert the computed pages, unlock.

use phase0::TokenId;
use phase1::KvPool;
use phase4::RadixTree;
use phase4::exercises::hit_rate::hit_rate;
use phase4::exercises::lfu::evict_lfu;
use phase4::exercises::longest_prefix_first::longest_prefix_first;
use proptest::prelude::*;

type Evict = fn(&mut RadixTree, &mut KvPool, usize) -> (usize, usize);

const PS: usize = 4;

fn lru(tree: &mut RadixTree, pool: &mut KvPool, n: usize) -> (usize, usize) {
    tree.evict(pool, n)
}

/// Serves one request; returns its prompt tokens that came from the cache.
fn serve_one(tree: &mut RadixTree, pool: &mut KvPool, tokens: &[TokenId], evict: Evict) -> usize {
    let m = tree.match_prefix(&tokens[..tokens.len() - 1]);
    tree.lock(m.node);
    for &p in &m.pages {
        pool.share(p).unwrap();
    }
    let need = tokens.len().div_ceil(PS) - m.pages.len();
    if need > pool.num_free() {
        evict(tree, pool, need - pool.num_free());
    }
    let mut pages = m.pages.clone();
    pages.extend(
        pool.allocate_many(need)
            .unwrap_or_else(|e| panic!("eviction left too little room: {e}\n{tree}")),
    );
    let full = tokens.len() / PS;
    tree.insert(pool, &tokens[..full * PS], &pages[..full])
        .unwrap();
    tree.unlock(m.node);
    pool.free_all(&pages).unwrap();
    m.num_tokens
}

/// Hit tokens of `requests` served in order in a pool of `pages` pages.
fn serve(requests: &[Vec<TokenId>], pages: usize, evict: Evict) -> usize {
    let mut pool = KvPool::new(pages, PS).unwrap();
    let mut tree = RadixTree::new(PS);
    let hits = requests
        .iter()
        .map(|r| serve_one(&mut tree, &mut pool, r, evict))
        .sum();
    evict(&mut tree, &mut pool, usize::MAX);
    assert_eq!(
        pool.num_free(),
        pages,
        "eviction of everything gives every page back"
    );
    assert_eq!(tree.num_nodes(), 0);
    hits
}

/// A 37-token prompt: prefix `p` (8 pages), then a question `q` of one page, then one token.
fn prompt(p: u32, q: u32) -> Vec<TokenId> {
    let mut t: Vec<TokenId> = (0..32).map(|i| 1000 * (p + 1) + i).collect();
    t.extend((0..5).map(|i| 500_000 + 10 * q + i));
    t
}

mod lfu {
    use super::*;

    #[test]
    fn the_least_used_leaf_goes_first_even_if_recent() {
        let mut pool = KvPool::new(64, PS).unwrap();
        let mut tree = RadixTree::new(PS);
        let (a, b) = (prompt(0, 0), prompt(1, 0));
        for tokens in [&a, &b] {
            serve_one(&mut tree, &mut pool, tokens, lru);
        }
        for _ in 0..3 {
            serve_one(&mut tree, &mut pool, &a, lru); // a is reused three times
        }
        serve_one(&mut tree, &mut pool, &b, lru); // b is reused once, most recently
        assert_eq!(evict_lfu(&mut tree, &mut pool, 9), (1, 9), "b's 9 pages go");
        assert_eq!(tree.sequences(), vec![a[..36].to_vec()]);
        let mut lru_tree = RadixTree::new(PS);
        let mut lru_pool = KvPool::new(64, PS).unwrap();
        for tokens in [&a, &b, &a, &a, &a, &b] {
            serve_one(&mut lru_tree, &mut lru_pool, tokens, lru);
        }
        lru_tree.evict(&mut lru_pool, 9);
        assert_eq!(
            lru_tree.sequences(),
            vec![b[..36].to_vec()],
            "LRU takes a instead"
        );
    }

    #[test]
    fn locked_paths_survive_and_parents_follow_their_children() {
        let mut pool = KvPool::new(64, PS).unwrap();
        let mut tree = RadixTree::new(PS);
        for q in 0..3 {
            serve_one(&mut tree, &mut pool, &prompt(0, q), lru);
        }
        serve_one(&mut tree, &mut pool, &prompt(1, 0), lru);
        let m = tree.match_prefix(&prompt(0, 1)[..36]);
        tree.lock(m.node);
        let (_, freed) = evict_lfu(&mut tree, &mut pool, usize::MAX);
        assert_eq!(
            freed,
            2 + 9,
            "two unlocked leaves under prefix 0, and prefix 1 whole"
        );
        assert_eq!(tree.sequences(), vec![prompt(0, 1)[..36].to_vec()]);
        tree.unlock(m.node);
        assert_eq!(evict_lfu(&mut tree, &mut pool, usize::MAX), (2, 9));
        assert_eq!(pool.num_free(), 64);
    }

    #[test]
    fn lfu_keeps_a_popular_prefix_through_a_scan() {
        // A popular prefix, then a burst of one-off prompts, then the popular prefix again.
        let mut requests: Vec<Vec<TokenId>> = (0..5).map(|q| prompt(0, q)).collect();
        requests.extend((1..=8).map(|p| prompt(p, 0)));
        requests.extend((5..10).map(|q| prompt(0, q)));
        let (with_lru, with_lfu) = (serve(&requests, 24, lru), serve(&requests, 24, evict_lfu));
        assert!(
            with_lfu > with_lru,
            "hit tokens after a scan: LFU {with_lfu}, LRU {with_lru}"
        );
        assert_eq!(with_lfu, 9 * 32, "LFU should hit the prefix on every reuse");
    }

    #[test]
    fn lru_adapts_when_popularity_moves_and_lfu_does_not() {
        // Prefix 0 is popular first; then prefixes 1 and 2 take turns.
        let mut requests: Vec<Vec<TokenId>> = (0..10).map(|q| prompt(0, q)).collect();
        requests.extend((0..12).map(|i| prompt(1 + i % 2, i)));
        let (with_lru, with_lfu) = (serve(&requests, 20, lru), serve(&requests, 20, evict_lfu));
        assert!(
            with_lru > with_lfu,
            "hit tokens when the hot prefix changes: LRU {with_lru}, LFU {with_lfu}"
        );
    }
}

mod hit_rate {
    use super::*;

    /// Page size 1, by brute force: each lookup's longest common prefix with any earlier
    /// request.
    fn longest_earlier_prefix(requests: &[Vec<TokenId>]) -> f64 {
        let (mut hits, mut looked_up) = (0, 0);
        for (i, r) in requests.iter().enumerate() {
            let lookup = &r[..r.len() - 1];
            let best = requests[..i]
                .iter()
                .map(|e| lookup.iter().zip(e).take_while(|(a, b)| a == b).count())
                .max()
                .unwrap_or(0);
            hits += best;
            looked_up += lookup.len();
        }
        if looked_up == 0 {
            0.0
        } else {
            hits as f64 / looked_up as f64
        }
    }

    fn requests() -> impl Strategy<Value = Vec<Vec<TokenId>>> {
        // Small alphabets make shared prefixes common.
        prop::collection::vec(prop::collection::vec(0u32..3, 1..40), 1..12)
    }

    proptest! {
        #[test]
        fn one_token_pages_find_every_shared_prefix(requests in requests()) {
            let got = hit_rate(&requests, 1);
            let want = longest_earlier_prefix(&requests);
            prop_assert!((got - want).abs() < 1e-12, "hit rate {} instead of {}", got, want);
        }

        #[test]
        fn a_page_size_that_divides_another_never_hits_less(
            requests in requests(),
            small in 1usize..5,
            times in 2usize..5,
        ) {
            let fine = hit_rate(&requests, small);
            let coarse = hit_rate(&requests, small * times);
            prop_assert!(fine >= coarse, "page {}: {}, page {}: {}", small, fine, small * times, coarse);
        }
    }

    #[test]
    fn a_system_prompt_shorter_than_a_page_is_never_shared() {
        // Ten questions of 10 tokens after the same 50-token system prompt.
        let system: Vec<TokenId> = (1..=50).collect();
        let requests: Vec<Vec<TokenId>> = (0..10)
            .map(|q| {
                let mut r = system.clone();
                r.extend((0..10).map(|i| 100 + 10 * q + i));
                r
            })
            .collect();
        let looked_up = 10.0 * 59.0;
        let expected_16 = 9.0 * 48.0 / looked_up; // three whole pages of the prompt
        assert!((hit_rate(&requests, 16) - expected_16).abs() < 1e-12);
        assert_eq!(
            hit_rate(&requests, 64),
            0.0,
            "50 tokens do not fill a 64-token page"
        );
        assert!((hit_rate(&requests, 1) - 9.0 * 50.0 / looked_up).abs() < 1e-12);
        assert_eq!(hit_rate(&[], 16), 0.0);
    }
}

mod longest_prefix_first {
    use super::*;

    #[test]
    fn the_longest_cached_prefix_goes_first_ties_in_arrival_order() {
        let mut pool = KvPool::new(64, PS).unwrap();
        let mut tree = RadixTree::new(PS);
        serve_one(&mut tree, &mut pool, &prompt(0, 0), lru);
        serve_one(&mut tree, &mut pool, &prompt(1, 0), lru);
        let mut half = prompt(1, 7);
        half[16..].iter_mut().for_each(|t| *t += 77); // shares 4 pages of prefix 1
        let waiting = vec![prompt(2, 0), half, prompt(0, 1), prompt(1, 1), prompt(0, 0)];
        assert_eq!(
            longest_prefix_first(&mut tree, &waiting),
            vec![4, 2, 3, 1, 0]
        );
        assert_eq!(longest_prefix_first(&mut tree, &[]), Vec::<usize>::new());
    }

    /// Serves `waiting` one at a time: FCFS, or picking by `longest_prefix_first` before
    /// each admission. Returns the hit tokens and the order served.
    fn serve_queue(waiting: &[Vec<TokenId>], pages: usize, lpm: bool) -> (usize, Vec<usize>) {
        let mut pool = KvPool::new(pages, PS).unwrap();
        let mut tree = RadixTree::new(PS);
        let mut left: Vec<usize> = (0..waiting.len()).collect();
        let (mut hits, mut order) = (0, Vec::new());
        while !left.is_empty() {
            let pick = if lpm {
                let prompts: Vec<Vec<TokenId>> = left.iter().map(|&i| waiting[i].clone()).collect();
                longest_prefix_first(&mut tree, &prompts)[0]
            } else {
                0
            };
            let i = left.remove(pick);
            hits += serve_one(&mut tree, &mut pool, &waiting[i], lru);
            order.push(i);
        }
        (hits, order)
    }

    #[test]
    fn grouping_by_cached_prefix_beats_arrival_order_under_memory_pressure() {
        // Four system prompts take turns; the pool holds about two of them.
        let waiting: Vec<Vec<TokenId>> = (0..24).map(|i| prompt(i % 4, i)).collect();
        let (fcfs, _) = serve_queue(&waiting, 24, false);
        let (lpm, order) = serve_queue(&waiting, 24, true);
        assert!(
            lpm >= 2 * fcfs.max(1),
            "hit tokens: longest prefix first {lpm}, arrival order {fcfs}"
        );
        assert_eq!(
            lpm,
            20 * 32,
            "every request but the first of each prefix hits"
        );
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..24).collect::<Vec<_>>(),
            "every request is served once"
        );
    }

    #[test]
    fn a_request_that_shares_nothing_waits_for_all_the_others() {
        let mut waiting: Vec<Vec<TokenId>> = vec![prompt(0, 0), prompt(9, 0)];
        waiting.extend((1..8).map(|q| prompt(0, q)));
        let (_, order) = serve_queue(&waiting, 64, true);
        assert_eq!(
            order.last(),
            Some(&1),
            "the lone prompt arrived second and is served last: {order:?}"
        );
    }
}
