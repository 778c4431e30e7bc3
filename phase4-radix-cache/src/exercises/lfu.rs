//! Exercise 4.1: least-frequently-used eviction.
//!
//! Build: [`evict_lfu`], the tree's `evict` with another order: the leaf whose K/V was
//! reused by the fewest requests goes first ([`LeafInfo::uses`]), the least recently used of
//! equally used ones first. As in `evict`, a parent left without children becomes a
//! candidate, and locked nodes are never touched.
//!
//! Why: LRU forgets a system prompt that every tenth request uses as soon as a burst of
//! one-off prompts passes through (a scan). Counting uses keeps what is popular, at the cost
//! of holding on to what *was* popular: the tests show a workload where each policy wins.
//!
//! Hint: [`RadixTree::evictable_leaves`], [`RadixTree::remove_leaf`] and
//! [`RadixTree::leaf_info`] are all the tree you need; a heap keeps the next victim at hand.
//!
//! Checked by `cargo test -p phase4 --features exercises --test exercises lfu`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use phase1::KvPool;

use crate::{LeafInfo, RadixTree};

/// Evicts the least used unlocked leaves until at least `num_pages` pages went back to the
/// pool (or nothing is evictable). Returns (nodes evicted, pages freed).
pub fn evict_lfu(tree: &mut RadixTree, pool: &mut KvPool, num_pages: usize) -> (usize, usize) {
    if !cfg!(feature = "solutions") {
        todo!("exercise 4.1: evict the least used leaves first, parents in turn");
    }
    // BEGIN SOLUTION
    let key = |leaf: LeafInfo| Reverse((leaf.uses, leaf.last_access, leaf.node));
    let mut heap: BinaryHeap<_> = tree.evictable_leaves().into_iter().map(key).collect();
    let (mut nodes, mut freed) = (0, 0);
    while freed < num_pages {
        let Some(Reverse((_, _, id))) = heap.pop() else {
            break;
        };
        let (pages, parent) = tree.remove_leaf(pool, id);
        freed += pages;
        nodes += 1;
        if let Some(leaf) = tree.leaf_info(parent) {
            heap.push(key(leaf));
        }
    }
    (nodes, freed)
    // END SOLUTION
}
