//! The radix tree against a naive model: a plain list of cached sequences. Whatever the
//! operations, matches agree with the model, locked paths survive eviction, the tree never
//! invents a prefix, and every page comes back when the tree is emptied.

use phase0::TokenId;
use phase1::{KvPool, PageId};
use phase4::RadixTree;
use proptest::prelude::*;

const PS: usize = 2;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<TokenId>),
    Match(Vec<TokenId>),
    LockMatch(Vec<TokenId>),
    UnlockOldest,
    Evict(usize),
}

/// Short sequences over a 3-letter alphabet, so that prefixes are shared often.
fn tokens() -> impl Strategy<Value = Vec<TokenId>> {
    prop::collection::vec(0u32..3, 0..12)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => tokens().prop_map(Op::Insert),
        3 => tokens().prop_map(Op::Match),
        1 => tokens().prop_map(Op::LockMatch),
        1 => Just(Op::UnlockOldest),
        1 => (0usize..6).prop_map(Op::Evict),
    ]
}

/// Longest common prefix of `a` and `b`, in whole pages, counted in tokens.
fn common_pages(a: &[TokenId], b: &[TokenId]) -> usize {
    a.chunks_exact(PS)
        .zip(b.chunks_exact(PS))
        .take_while(|(x, y)| x == y)
        .count()
        * PS
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn tree_agrees_with_a_list_of_sequences(ops in prop::collection::vec(op(), 1..80)) {
        let mut pool = KvPool::new(4096, PS).unwrap();
        let mut tree = RadixTree::new(PS);
        let mut model: Vec<Vec<TokenId>> = Vec::new();
        // (node, tokens, pages) of each lock held, with the pages the "sequence" holds.
        let mut locks: Vec<(usize, Vec<TokenId>, Vec<PageId>)> = Vec::new();

        for op in ops {
            match op {
                Op::Insert(mut t) => {
                    t.truncate(t.len() / PS * PS);
                    let pages = pool.allocate_many(t.len() / PS).unwrap();
                    let new = tree.insert(&mut pool, &t, &pages).unwrap();
                    let known = model.iter().map(|m| common_pages(m, &t)).max().unwrap_or(0);
                    prop_assert_eq!(new, t.len() - known);
                    pool.free_all(&pages).unwrap();
                    if !t.is_empty() {
                        model.push(t);
                    }
                }
                Op::Match(t) => {
                    let m = tree.match_prefix(&t);
                    let expected = model.iter().map(|s| common_pages(s, &t)).max().unwrap_or(0);
                    prop_assert_eq!(m.num_tokens, expected);
                    prop_assert_eq!(m.pages.len() * PS, m.num_tokens);
                }
                Op::LockMatch(t) => {
                    let m = tree.match_prefix(&t);
                    tree.lock(m.node);
                    for &p in &m.pages {
                        pool.share(p).unwrap();
                    }
                    locks.push((m.node, t[..m.num_tokens].to_vec(), m.pages));
                }
                Op::UnlockOldest => {
                    if !locks.is_empty() {
                        let (node, _, pages) = locks.remove(0);
                        tree.unlock(node);
                        pool.free_all(&pages).unwrap();
                    }
                }
                Op::Evict(n) => {
                    let free_before = pool.num_free();
                    let (_, freed) = tree.evict(&mut pool, n);
                    prop_assert_eq!(pool.num_free(), free_before + freed);
                    let now = tree.sequences();
                    // No invented prefix: every remaining sequence is a prefix of a modelled one.
                    for s in &now {
                        prop_assert!(model.iter().any(|m| m.starts_with(s)), "invented {:?}", s);
                    }
                    // Locked prefixes survive, with the same pages.
                    for (_, t, pages) in &locks {
                        let m = tree.match_prefix(t);
                        prop_assert_eq!(m.num_tokens, t.len());
                        prop_assert_eq!(&m.pages, pages);
                    }
                    model = now;
                }
            }
            // The tree holds one holder of each of its pages; locks add theirs.
            prop_assert_eq!(pool.num_used(), tree.pages_held());
        }
        for (node, _, pages) in locks.drain(..) {
            tree.unlock(node);
            pool.free_all(&pages).unwrap();
        }
        tree.evict(&mut pool, usize::MAX);
        prop_assert_eq!(tree.num_nodes(), 0);
        prop_assert_eq!(pool.num_free(), 4096, "no page leaked");
    }
}
