//! Exercise 6.2.1: which registered chunk to evict, weighing what it costs to recompute.
//!
//! Build: [`GreedyDualSize`], the eviction order of GreedyDual-Size (Cao and Irani, 1997).
//! Each chunk holds a credit `H = L + cost / pages`, set when it is registered and again each
//! time a request uses it; the victim is the chunk with the smallest credit, and the
//! inflation `L` rises to the victim's credit, so that a chunk nobody uses falls behind the
//! chunks used after it, as under LRU.
//!
//! Why: the chunk store evicts the least recently used chunk, which treats a 16k-token document
//! and a 40-token system prompt alike. What eviction frees is pages; what it costs is the
//! prefill to compute the chunk again, which grows faster than its length (attention is
//! quadratic). Credit per page keeps the chunks that are dear to recompute for the memory they
//! take, and the inflation still ages out the ones nobody asks for.
//!
//! Checked by `cargo test -p phase6-chunks --features exercises --test exercises chunk_eviction`.

use std::collections::HashMap;

/// GreedyDual-Size over chunks named by `u64` ids.
#[derive(Debug, Clone, Default)]
pub struct GreedyDualSize {
    /// The inflation: the credit of the last victim.
    inflation: f64,
    /// Each chunk's credit and the order of its last touch (older touches break ties first).
    credit: HashMap<u64, (f64, u64)>,
    touches: u64,
}

impl GreedyDualSize {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.credit.len()
    }

    pub fn is_empty(&self) -> bool {
        self.credit.is_empty()
    }

    /// A chunk was registered or used: its credit becomes `inflation + cost / pages`, where
    /// `cost` is what computing it again would take (any unit, e.g. prefill microseconds) and
    /// `pages` the KV pages it holds (at least 1 counts).
    pub fn touch(&mut self, id: u64, pages: usize, cost: f64) {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.2.1: credit = the inflation plus the cost per page");
        }
        // BEGIN SOLUTION
        self.touches += 1;
        let credit = self.inflation + cost / pages.max(1) as f64;
        self.credit.insert(id, (credit, self.touches));
        // END SOLUTION
    }

    /// The chunk to evict: the smallest credit, the least recently touched among equals.
    /// `None` when no chunk is held.
    pub fn victim(&self) -> Option<u64> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.2.1: the smallest credit, ties to the oldest touch");
        }
        // BEGIN SOLUTION
        self.credit
            .iter()
            .min_by(|a, b| a.1.0.total_cmp(&b.1.0).then(a.1.1.cmp(&b.1.1)))
            .map(|(&id, _)| id)
        // END SOLUTION
    }

    /// Evicts chunk `id` (usually [`victim`](Self::victim)'s answer): it is forgotten and the
    /// inflation rises to its credit (it never falls). Returns false for an unknown id.
    pub fn evict(&mut self, id: u64) -> bool {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.2.1: forget it, raise the inflation to its credit");
        }
        // BEGIN SOLUTION
        match self.credit.remove(&id) {
            Some((credit, _)) => {
                self.inflation = self.inflation.max(credit);
                true
            }
            None => false,
        }
        // END SOLUTION
    }

    /// The current inflation `L`.
    pub fn inflation(&self) -> f64 {
        self.inflation
    }
}
