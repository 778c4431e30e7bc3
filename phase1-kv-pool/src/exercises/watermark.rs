//! Exercise 1.2: a watermark, pages kept back from admission for decode.
//!
//! Build: [`Watermark`], the admission rule vLLM's block manager applies to new prompts: a
//! prompt is admitted only if, after taking its pages, at least `pages` pages stay free.
//! Decode steps of running sequences may still use those last pages.
//!
//! Why: an admission rule that fills the pool to the last page leaves nothing for the
//! sequences already running; the very next decode step that crosses a page boundary has to
//! preempt one of them and throw its work away (chapter 5). A small reserve (vLLM keeps 1% of
//! the blocks) trades a little admission for far fewer preemptions.
//!
//! Checked by `cargo test -p phase1 --features exercises --test exercises watermark`.

use crate::{BlockTable, Error, KvPool};

/// What admission says about a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Its pages can be taken now, leaving the reserve free.
    Now,
    /// Not now; once running sequences give pages back it will be.
    Later,
    /// Not even an empty pool could take it and keep the reserve: refuse it.
    Never,
}

/// The number of pages admission leaves free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub pages: usize,
}

impl Watermark {
    /// A reserve of `fraction` of the pool's pages, rounded down (vLLM's `watermark=0.01`).
    pub fn of_pool(pool: &KvPool, fraction: f64) -> Self {
        Self {
            pages: (pool.num_pages() as f64 * fraction) as usize,
        }
    }

    /// Whether a prompt of `num_tokens` (in a new block table) may be admitted.
    pub fn check(&self, pool: &KvPool, num_tokens: usize) -> Admission {
        if !cfg!(feature = "solutions") {
            todo!("exercise 1.2: now, later or never, keeping `pages` free");
        }
        // BEGIN SOLUTION
        let need = pool.pages_for(num_tokens) + self.pages;
        if need > pool.num_pages() {
            Admission::Never
        } else if need > pool.num_free() {
            Admission::Later
        } else {
            Admission::Now
        }
        // END SOLUTION
    }

    /// Reserves a new block table of `num_tokens` if [`Watermark::check`] says `Now`;
    /// otherwise an `OutOfPages` error for the pages it would need, reserve included, and
    /// the pool is unchanged.
    pub fn admit(&self, pool: &mut KvPool, num_tokens: usize) -> Result<BlockTable, Error> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 1.2: admit a prompt only above the watermark");
        }
        // BEGIN SOLUTION
        if self.check(pool, num_tokens) != Admission::Now {
            return Err(Error::OutOfPages {
                requested: pool.pages_for(num_tokens) + self.pages,
                free: pool.num_free(),
                total: pool.num_pages(),
            });
        }
        let mut table = BlockTable::new();
        table.append_tokens(pool, num_tokens)?;
        Ok(table)
        // END SOLUTION
    }
}
