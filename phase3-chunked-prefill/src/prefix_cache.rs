//! The hook through which a prefix cache takes part in admission (chapter 4 fills it in).
//!
//! When a new sequence is admitted, the cache may already hold the K/V of the start of its
//! prompt: the sequence then starts with those pages and prefills only the rest. When it
//! leaves (finished or preempted), its computed pages are offered back to the cache. When the
//! pool runs dry, the cache gives up pages nobody else holds.

use phase0::{SeqId, TokenId};
use phase1::{KvPool, PageId};

pub trait PrefixCache {
    /// Pages holding the K/V of the longest cached prefix of `tokens` (whole pages only), each
    /// with a holder added for the sequence, and their token count. The cache keeps that
    /// prefix from eviction until [`PrefixCache::release`] for the same sequence.
    fn acquire(
        &mut self,
        pool: &mut KvPool,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> (Vec<PageId>, usize);

    /// The sequence is leaving: `pages` hold the K/V of `tokens` (its computed tokens, in
    /// order). The cache may keep them (adding its own holders); the sequence still frees its
    /// own holders afterwards.
    fn release(&mut self, pool: &mut KvPool, seq: SeqId, tokens: &[TokenId], pages: &[PageId]);

    /// Frees up to `num_pages` pages that only the cache holds; returns how many it freed.
    fn evict(&mut self, pool: &mut KvPool, num_pages: usize) -> usize;
}

/// No cache at all: every prompt is computed from scratch.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPrefixCache;

impl PrefixCache for NoPrefixCache {
    fn acquire(&mut self, _: &mut KvPool, _: SeqId, _: &[TokenId]) -> (Vec<PageId>, usize) {
        (Vec::new(), 0)
    }

    fn release(&mut self, _: &mut KvPool, _: SeqId, _: &[TokenId], _: &[PageId]) {}

    fn evict(&mut self, _: &mut KvPool, _: usize) -> usize {
        0
    }
}
