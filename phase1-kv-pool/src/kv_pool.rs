//! The pool of KV pages: allocation, reference counts and the prefix-hash cache.
//!
//! A page is either *used* (reference count > 0: some sequences, or a cache, hold it) or
//! *free* (count 0, waiting in the [`FreeQueue`]). Sharing a page (two sequences with the
//! same prefix, a prefix cache keeping a finished request's pages) adds a holder; freeing
//! removes one; the page returns to the free queue when the last holder lets go. This is the
//! block manager of vLLM's PagedAttention, without the K/V numbers themselves.

use std::collections::HashMap;
use std::fmt;

use crate::error::Error;
use crate::free_queue::FreeQueue;
use crate::prefix_hash::PageHash;

/// The index of a page in the pool (and in the runner's K/V storage).
pub type PageId = u32;

/// A fixed set of `num_pages` pages of `page_size` token slots each.
#[derive(Debug, Clone)]
pub struct KvPool {
    page_size: usize,
    ref_counts: Vec<u32>,
    free: FreeQueue,
    /// The prefix hash of pages that hold a full, computed page of some prefix.
    page_hash: Vec<Option<PageHash>>,
    /// Hash -> page, for pages still holding that content (used or free).
    by_hash: HashMap<PageHash, PageId>,
}

impl KvPool {
    pub fn new(num_pages: usize, page_size: usize) -> Result<Self, Error> {
        if page_size == 0 {
            return Err(Error::InvalidShape("page_size must be at least 1".into()));
        }
        if num_pages >= PageId::MAX as usize {
            return Err(Error::InvalidShape(format!(
                "{num_pages} pages do not fit a 32-bit page id"
            )));
        }
        Ok(Self {
            page_size,
            ref_counts: vec![0; num_pages],
            free: FreeQueue::full(num_pages),
            page_hash: vec![None; num_pages],
            by_hash: HashMap::new(),
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn num_pages(&self) -> usize {
        self.ref_counts.len()
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.num_pages() - self.num_free()
    }

    /// Pages whose content is known by prefix hash (used or free).
    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// Number of holders of a page (0 when free).
    pub fn ref_count(&self, page: PageId) -> Result<u32, Error> {
        self.check(page)?;
        Ok(self.ref_counts[page as usize])
    }

    /// Pages needed to hold `num_tokens` tokens.
    pub fn pages_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.page_size)
    }

    fn check(&self, page: PageId) -> Result<(), Error> {
        if (page as usize) < self.num_pages() {
            Ok(())
        } else {
            Err(Error::NoSuchPage {
                page,
                num_pages: self.num_pages(),
            })
        }
    }

    fn out_of_pages(&self, requested: usize) -> Error {
        Error::OutOfPages {
            requested,
            free: self.num_free(),
            total: self.num_pages(),
        }
    }

    /// Takes a free page (the one freed longest ago) with one holder.
    pub fn allocate(&mut self) -> Result<PageId, Error> {
        // BEGIN SOLUTION
        let page = self.free.pop_front().ok_or_else(|| self.out_of_pages(1))?;
        // Its old content is about to be overwritten: forget what prefix it held.
        if let Some(h) = self.page_hash[page as usize].take() {
            self.by_hash.remove(&h);
        }
        self.ref_counts[page as usize] = 1;
        Ok(page)
        // END SOLUTION
    }

    /// Takes `n` pages, or none at all if fewer than `n` are free.
    pub fn allocate_many(&mut self, n: usize) -> Result<Vec<PageId>, Error> {
        if n > self.num_free() {
            return Err(self.out_of_pages(n));
        }
        (0..n).map(|_| self.allocate()).collect()
    }

    /// Adds a holder to a used page.
    pub fn share(&mut self, page: PageId) -> Result<(), Error> {
        // BEGIN SOLUTION
        self.check(page)?;
        match self.ref_counts[page as usize] {
            0 => Err(Error::NotAllocated(page)),
            _ => {
                self.ref_counts[page as usize] += 1;
                Ok(())
            }
        }
        // END SOLUTION
    }

    /// Removes a holder; the last one sends the page back to the free queue.
    pub fn free(&mut self, page: PageId) -> Result<(), Error> {
        // BEGIN SOLUTION
        self.check(page)?;
        let count = &mut self.ref_counts[page as usize];
        match *count {
            0 => Err(Error::NotAllocated(page)),
            1 => {
                *count = 0;
                self.free.push_back(page);
                Ok(())
            }
            _ => {
                *count -= 1;
                Ok(())
            }
        }
        // END SOLUTION
    }

    /// Frees each page once; stops at the first error.
    pub fn free_all(&mut self, pages: &[PageId]) -> Result<(), Error> {
        pages.iter().try_for_each(|&p| self.free(p))
    }

    /// Records that a used page now holds the full, computed page whose chain hash is `hash`,
    /// so later requests with the same prefix can find it. If another page already holds that
    /// content, the first one stays the one found.
    pub fn cache_page(&mut self, page: PageId, hash: PageHash) -> Result<(), Error> {
        self.check(page)?;
        if self.ref_counts[page as usize] == 0 {
            return Err(Error::NotAllocated(page));
        }
        if self.page_hash[page as usize].is_none() && !self.by_hash.contains_key(&hash) {
            self.page_hash[page as usize] = Some(hash);
            self.by_hash.insert(hash, page);
        }
        Ok(())
    }

    /// Finds the page holding `hash` and adds a holder, taking it back from the free queue if
    /// nobody held it. `None` is a cache miss.
    pub fn lookup(&mut self, hash: &PageHash) -> Option<PageId> {
        // BEGIN SOLUTION
        let page = *self.by_hash.get(hash)?;
        if self.ref_counts[page as usize] == 0 {
            self.free.remove(page);
        }
        self.ref_counts[page as usize] += 1;
        Some(page)
        // END SOLUTION
    }

    /// The prefix hash a page is known by, if any.
    pub fn page_hash(&self, page: PageId) -> Option<PageHash> {
        self.page_hash.get(page as usize).copied().flatten()
    }
}

/// A table of every page for people: holders, prefix hash, and whether it is free.
impl fmt::Display for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "KvPool: {} pages x {} tokens, {} used, {} free, {} cached",
            self.num_pages(),
            self.page_size,
            self.num_used(),
            self.num_free(),
            self.num_cached()
        )?;
        writeln!(f, "page refs hash")?;
        for (page, &refs) in self.ref_counts.iter().enumerate() {
            let hash = self.page_hash[page].map_or("-".to_string(), |h| h.to_string());
            let state = if refs == 0 { "  (free)" } else { "" };
            writeln!(f, "{page:>4} {refs:>4} {hash}{state}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_until_empty_then_error_not_panic() {
        let mut pool = KvPool::new(2, 4).unwrap();
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.num_free(), 0);
        let err = pool.allocate().unwrap_err();
        assert_eq!(
            err,
            Error::OutOfPages {
                requested: 1,
                free: 0,
                total: 2
            }
        );
        assert_eq!(err.to_string(), "out of KV pages: 1 requested, 0 free of 2");
    }

    #[test]
    fn allocate_many_is_all_or_nothing() {
        let mut pool = KvPool::new(3, 4).unwrap();
        assert!(pool.allocate_many(4).is_err());
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.allocate_many(3).unwrap().len(), 3);
    }

    #[test]
    fn shared_page_is_freed_by_its_last_holder() {
        let mut pool = KvPool::new(2, 4).unwrap();
        let p = pool.allocate().unwrap();
        pool.share(p).unwrap();
        assert_eq!(pool.ref_count(p).unwrap(), 2);
        pool.free(p).unwrap();
        assert_eq!(pool.num_free(), 1);
        pool.free(p).unwrap();
        assert_eq!(pool.num_free(), 2);
        assert_eq!(pool.free(p).unwrap_err(), Error::NotAllocated(p));
        assert_eq!(pool.share(p).unwrap_err(), Error::NotAllocated(p));
        assert!(matches!(
            pool.free(9),
            Err(Error::NoSuchPage { page: 9, .. })
        ));
    }

    #[test]
    fn freed_cached_page_is_found_again_until_reused() {
        let mut pool = KvPool::new(2, 2).unwrap();
        let h = PageHash::chain(None, &[1, 2]);
        let p = pool.allocate().unwrap();
        pool.cache_page(p, h).unwrap();
        pool.free(p).unwrap();
        assert_eq!(pool.num_free(), 2);
        // A hit takes it back out of the free queue.
        assert_eq!(pool.lookup(&h), Some(p));
        assert_eq!(pool.ref_count(p).unwrap(), 1);
        assert_eq!(pool.num_free(), 1);
        pool.free(p).unwrap();
        // Allocation takes the oldest free page first, then the cached one, whose hash goes.
        let q = pool.allocate().unwrap();
        assert_ne!(q, p);
        assert_eq!(pool.allocate().unwrap(), p);
        assert_eq!(pool.lookup(&h), None);
        assert_eq!(pool.num_cached(), 0);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(matches!(KvPool::new(4, 0), Err(Error::InvalidShape(_))));
    }
}
