//! One sequence's map from token positions to page slots.
//!
//! Token `i` of a block table lives in page `pages[i / page_size]` at slot `i % page_size`.
//! A table only grows at its end: prefill reserves the pages for a run of tokens, decode adds
//! one slot per step and needs a new page only when the last one is full. That is all the
//! fragmentation paging leaves: less than one page per sequence.
//!
//! A table is also the unit of *sharing*: a sequence's KV may be several tables (segments),
//! shared ones first (a cached prefix, a registered chunk), its own last; each starts on a
//! fresh page (docs/ARCHITECTURE.md, "KV segments").

use std::fmt;

use phase0::TokenId;

use crate::error::Error;
use crate::kv_pool::{KvPool, PageId};
use crate::prefix_hash::prefix_hashes;

/// Where one token's K/V goes: a page and a slot in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub page: PageId,
    pub offset: usize,
}

/// The pages of one run of tokens, in order, and how many tokens they hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BlockTable {
    pages: Vec<PageId>,
    num_tokens: usize,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// A table over pages someone else allocated (for example a cache's shared pages).
    /// The caller is responsible for the holders of those pages.
    pub fn from_pages(pages: Vec<PageId>, num_tokens: usize) -> Self {
        Self { pages, num_tokens }
    }

    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    pub fn is_empty(&self) -> bool {
        self.num_tokens == 0
    }

    /// Token slots in the pages held: `pages.len() * page_size`.
    pub fn capacity(&self, page_size: usize) -> usize {
        self.pages.len() * page_size
    }

    /// Where token `i` lives.
    pub fn slot(&self, i: usize, page_size: usize) -> Slot {
        Slot {
            page: self.pages[i / page_size],
            offset: i % page_size,
        }
    }

    /// New pages needed to add `n` tokens.
    pub fn pages_needed(&self, n: usize, page_size: usize) -> usize {
        (self.num_tokens + n)
            .div_ceil(page_size)
            .saturating_sub(self.pages.len())
    }

    /// Can decode add one more token? True when the last page has room or a page is free.
    pub fn can_append(&self, pool: &KvPool) -> bool {
        self.pages_needed(1, pool.page_size()) <= pool.num_free()
    }

    /// Grows the table by one token (taking a new page if the last is full) and returns the
    /// slot where the new token's K/V must be written.
    pub fn append_slot(&mut self, pool: &mut KvPool) -> Result<Slot, Error> {
        // BEGIN SOLUTION
        if self.num_tokens == self.capacity(pool.page_size()) {
            self.pages.push(pool.allocate()?);
        }
        let slot = self.slot(self.num_tokens, pool.page_size());
        self.num_tokens += 1;
        Ok(slot)
        // END SOLUTION
    }

    /// Grows the table by `n` tokens, all or nothing: on error it is unchanged.
    pub fn append_tokens(&mut self, pool: &mut KvPool, n: usize) -> Result<(), Error> {
        // BEGIN SOLUTION
        let new_pages = pool.allocate_many(self.pages_needed(n, pool.page_size()))?;
        self.pages.extend(new_pages);
        self.num_tokens += n;
        Ok(())
        // END SOLUTION
    }

    /// Builds the table of a new prompt, reusing cached pages for its longest prefix of full
    /// pages whose chain hashes the pool knows, and allocating the rest. Returns the table and
    /// how many leading tokens are already computed (a multiple of the page size). All or
    /// nothing: on error no page is held.
    pub fn allocate_prompt(pool: &mut KvPool, tokens: &[TokenId]) -> Result<(Self, usize), Error> {
        // BEGIN SOLUTION
        let mut table = BlockTable::new();
        for hash in prefix_hashes(tokens, pool.page_size()) {
            match pool.lookup(&hash) {
                Some(page) => table.pages.push(page),
                None => break,
            }
        }
        let cached = table.pages.len() * pool.page_size();
        table.num_tokens = cached;
        if let Err(e) = table.append_tokens(pool, tokens.len() - cached) {
            table.release(pool)?;
            return Err(e);
        }
        Ok((table, cached))
        // END SOLUTION
    }

    /// After the K/V of `tokens` (this table's tokens) is computed, names each full page by
    /// its prefix hash so later prompts can reuse it.
    pub fn cache_full_pages(&self, pool: &mut KvPool, tokens: &[TokenId]) -> Result<(), Error> {
        let hashes = prefix_hashes(
            &tokens[..self.num_tokens.min(tokens.len())],
            pool.page_size(),
        );
        for (&page, hash) in self.pages.iter().zip(hashes) {
            pool.cache_page(page, hash)?;
        }
        Ok(())
    }

    /// Gives every page back (one holder each) and empties the table.
    pub fn release(&mut self, pool: &mut KvPool) -> Result<(), Error> {
        let pages = std::mem::take(&mut self.pages);
        self.num_tokens = 0;
        pool.free_all(&pages)
    }
}

/// `3 tokens in [4 7]`: compact, for traces.
impl fmt::Display for BlockTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} tokens in [", self.num_tokens)?;
        for (i, p) in self.pages.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{p}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_takes_a_new_page_only_when_the_last_is_full() {
        let mut pool = KvPool::new(4, 2).unwrap();
        let mut t = BlockTable::new();
        assert_eq!(
            t.append_slot(&mut pool).unwrap(),
            Slot { page: 0, offset: 0 }
        );
        assert_eq!(
            t.append_slot(&mut pool).unwrap(),
            Slot { page: 0, offset: 1 }
        );
        assert_eq!(pool.num_free(), 3);
        assert_eq!(
            t.append_slot(&mut pool).unwrap(),
            Slot { page: 1, offset: 0 }
        );
        assert_eq!(t.to_string(), "3 tokens in [0 1]");
        assert_eq!(t.slot(2, 2), Slot { page: 1, offset: 0 });
    }

    #[test]
    fn can_append_tells_the_truth() {
        let mut pool = KvPool::new(1, 2).unwrap();
        let mut t = BlockTable::new();
        t.append_tokens(&mut pool, 2).unwrap();
        assert!(!t.can_append(&pool));
        assert!(t.append_slot(&mut pool).is_err());
        assert_eq!(t.num_tokens(), 2, "a failed append changes nothing");
        t.release(&mut pool).unwrap();
        assert_eq!(pool.num_free(), 1);
        assert!(t.is_empty());
    }

    #[test]
    fn append_tokens_is_all_or_nothing() {
        let mut pool = KvPool::new(3, 4).unwrap();
        let mut t = BlockTable::new();
        t.append_tokens(&mut pool, 5).unwrap();
        assert_eq!(t.pages().len(), 2);
        assert_eq!(t.pages_needed(3, 4), 0);
        assert_eq!(t.pages_needed(4, 4), 1);
        assert!(t.append_tokens(&mut pool, 8).is_err());
        assert_eq!((t.pages().len(), t.num_tokens()), (2, 5));
        assert_eq!(pool.num_free(), 1);
    }

    #[test]
    fn identical_prefixes_share_full_pages() {
        let mut pool = KvPool::new(8, 2).unwrap();
        let a_tokens = [1, 2, 3, 4, 5];
        let (a, cached) = BlockTable::allocate_prompt(&mut pool, &a_tokens).unwrap();
        assert_eq!(cached, 0);
        a.cache_full_pages(&mut pool, &a_tokens).unwrap();

        let (b, cached) = BlockTable::allocate_prompt(&mut pool, &[1, 2, 3, 4, 9, 9, 9]).unwrap();
        assert_eq!(cached, 4, "two full pages shared");
        assert_eq!(a.pages()[..2], b.pages()[..2]);
        assert_ne!(
            a.pages()[2],
            b.pages()[2],
            "the partial page is never shared"
        );
        assert_eq!(pool.ref_count(a.pages()[0]).unwrap(), 2);

        let (c, cached) = BlockTable::allocate_prompt(&mut pool, &[1, 2, 7, 7]).unwrap();
        assert_eq!(cached, 2);
        assert_eq!(c.pages()[0], a.pages()[0]);
    }

    #[test]
    fn failed_prompt_allocation_holds_nothing() {
        let mut pool = KvPool::new(3, 2).unwrap();
        let tokens = [1, 2, 3, 4];
        let (mut a, _) = BlockTable::allocate_prompt(&mut pool, &tokens).unwrap();
        a.cache_full_pages(&mut pool, &tokens).unwrap();
        // Shares a's two pages, then needs three more with only one free.
        let err = BlockTable::allocate_prompt(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert!(matches!(err, Err(Error::OutOfPages { .. })));
        assert_eq!(pool.ref_count(a.pages()[0]).unwrap(), 1);
        assert_eq!(pool.num_free(), 1);
        a.release(&mut pool).unwrap();
        assert_eq!(pool.num_free(), 3);
    }
}
