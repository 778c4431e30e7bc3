//! The free pages, least recently freed first, with O(1) removal from the middle.
//!
//! A freed page that holds a full, hashed page of some prefix is still worth something: a
//! later request with the same prefix can take it back without recomputing it. So free pages
//! wait in a queue and the allocator takes the one freed longest ago (the least likely to be
//! wanted again), while a cache hit pulls a page out of the middle. A doubly linked list
//! threaded through two arrays indexed by page id does both in constant time, the same shape
//! as vLLM's free block queue.

use crate::kv_pool::PageId;

const NIL: PageId = PageId::MAX;

/// A FIFO of page ids with `remove` in O(1).
#[derive(Debug, Clone)]
pub struct FreeQueue {
    prev: Vec<PageId>,
    next: Vec<PageId>,
    queued: Vec<bool>,
    head: PageId,
    tail: PageId,
    len: usize,
}

impl FreeQueue {
    /// A queue able to hold pages `0 .. capacity`, holding all of them in order.
    pub fn full(capacity: usize) -> Self {
        let mut q = Self {
            prev: vec![NIL; capacity],
            next: vec![NIL; capacity],
            queued: vec![false; capacity],
            head: NIL,
            tail: NIL,
            len: 0,
        };
        for page in 0..capacity {
            q.push_back(page as PageId);
        }
        q
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, page: PageId) -> bool {
        self.queued[page as usize]
    }

    /// Appends a page; it must not be queued already.
    pub fn push_back(&mut self, page: PageId) {
        // BEGIN SOLUTION
        debug_assert!(!self.contains(page), "page {page} queued twice");
        let p = page as usize;
        self.prev[p] = self.tail;
        self.next[p] = NIL;
        if self.tail == NIL {
            self.head = page;
        } else {
            self.next[self.tail as usize] = page;
        }
        self.tail = page;
        self.queued[p] = true;
        self.len += 1;
        // END SOLUTION
    }

    /// Takes the page freed longest ago.
    pub fn pop_front(&mut self) -> Option<PageId> {
        let page = self.head;
        if page == NIL {
            return None;
        }
        self.remove(page);
        Some(page)
    }

    /// Takes a page out wherever it is; returns false if it was not queued.
    pub fn remove(&mut self, page: PageId) -> bool {
        // BEGIN SOLUTION
        let p = page as usize;
        if !self.queued[p] {
            return false;
        }
        let (before, after) = (self.prev[p], self.next[p]);
        if before == NIL {
            self.head = after;
        } else {
            self.next[before as usize] = after;
        }
        if after == NIL {
            self.tail = before;
        } else {
            self.prev[after as usize] = before;
        }
        self.prev[p] = NIL;
        self.next[p] = NIL;
        self.queued[p] = false;
        self.len -= 1;
        true
        // END SOLUTION
    }

    /// The queued pages from front to back.
    pub fn iter(&self) -> impl Iterator<Item = PageId> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&p| {
            let n = self.next[p as usize];
            (n != NIL).then_some(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_with_removal_from_the_middle() {
        let mut q = FreeQueue::full(5);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert!(q.remove(2));
        assert!(!q.remove(2));
        assert_eq!(q.pop_front(), Some(0));
        q.push_back(0);
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![1, 3, 4, 0]);
        assert!(q.remove(0));
        assert!(q.remove(1));
        assert_eq!(q.iter().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_front(), Some(3));
        assert_eq!(q.pop_front(), Some(4));
        assert_eq!(q.pop_front(), None);
        assert!(q.is_empty());
    }
}
