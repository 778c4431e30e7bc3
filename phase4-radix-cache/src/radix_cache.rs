//! The radix tree plugged into admission: the chapter 3 scheduler's prefix cache.
//!
//! A new sequence locks its matched path and holds the matched pages; when it leaves, its
//! computed pages go into the tree (which takes its own holders for the new part) and the
//! lock is dropped. Pages the tree holds alone are what eviction can give back.

use std::collections::HashMap;

use phase0::{SeqId, TokenId};
use phase1::{KvPool, PageId};
use phase3::PrefixCache;

use crate::radix_tree::{NodeId, RadixTree};
use crate::stats::CacheStats;

#[derive(Debug)]
pub struct RadixCache {
    tree: RadixTree,
    /// The node each running sequence locked at admission.
    locked: HashMap<SeqId, NodeId>,
    stats: CacheStats,
}

impl RadixCache {
    pub fn new(page_size: usize) -> Self {
        Self {
            tree: RadixTree::new(page_size),
            locked: HashMap::new(),
            stats: CacheStats::default(),
        }
    }

    pub fn tree(&self) -> &RadixTree {
        &self.tree
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            pages_held: self.tree.pages_held() as u64,
            ..self.stats
        }
    }

    /// Evicts everything evictable (for tests and for shutting down cleanly).
    pub fn clear(&mut self, pool: &mut KvPool) {
        self.evict(pool, usize::MAX);
    }
}

impl PrefixCache for RadixCache {
    /// Matches the prompt in the tree, locks the matched path and gives the sequence a holder
    /// of each matched page; the lookup and its hit tokens go into the statistics.
    fn acquire(
        &mut self,
        pool: &mut KvPool,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> (Vec<PageId>, usize) {
        // BEGIN SOLUTION
        let m = self.tree.match_prefix(tokens);
        self.tree.lock(m.node);
        if let Some(old) = self.locked.insert(seq, m.node) {
            self.tree.unlock(old);
        }
        for &p in &m.pages {
            pool.share(p).expect("tree pages are allocated");
        }
        self.stats.lookups += 1;
        self.stats.lookup_tokens += tokens.len() as u64;
        self.stats.hit_tokens += m.num_tokens as u64;
        (m.pages, m.num_tokens)
        // END SOLUTION
    }

    /// Inserts the sequence's whole computed pages into the tree (which takes its own holders
    /// of the new ones) and unlocks the path the sequence locked at admission.
    fn release(&mut self, pool: &mut KvPool, seq: SeqId, tokens: &[TokenId], pages: &[PageId]) {
        // BEGIN SOLUTION
        let full_pages = (tokens.len() / self.tree.page_size()).min(pages.len());
        let n = full_pages * self.tree.page_size();
        let new = self
            .tree
            .insert(pool, &tokens[..n], &pages[..full_pages])
            .expect("a leaving sequence holds its pages");
        self.stats.inserted_tokens += new as u64;
        if let Some(node) = self.locked.remove(&seq) {
            self.tree.unlock(node);
        }
        // END SOLUTION
    }

    fn evict(&mut self, pool: &mut KvPool, num_pages: usize) -> usize {
        let (nodes, pages) = self.tree.evict(pool, num_pages);
        self.stats.evicted_nodes += nodes as u64;
        self.stats.evicted_pages += pages as u64;
        pages
    }
}
