//! Exercise 1.3: fork a sequence, copy a page only when one of the copies writes to it.
//!
//! Build: [`fork`], which gives a second sequence every page of the first (one more holder
//! each, no K/V copied), and [`append_slot_cow`], decode's `append_slot` for tables that may
//! share pages: a token may only be written into a page its table holds alone, so a shared,
//! partly filled last page is first replaced by a fresh page, and the runner is told to copy
//! the K/V across before writing.
//!
//! Why: parallel sampling (`n` answers to one prompt) and beam search start many sequences
//! from the same tokens. Sharing the pages costs nothing; copying the prompt's K/V for each
//! would cost `n` times its memory. Only the last, partly filled page ever needs a copy, and
//! only once per copy that writes: the operating system's copy-on-write fork, and vLLM's.
//!
//! Checked by `cargo test -p phase1 --features exercises --test exercises copy_on_write`.

use crate::{BlockTable, Error, KvPool, PageId, Slot};

/// A page copy the runner must do before the step writes: the K/V of `from` into `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    pub from: PageId,
    pub to: PageId,
}

/// A table over the same pages and tokens as `table`, holding each page once more.
pub fn fork(pool: &mut KvPool, table: &BlockTable) -> Result<BlockTable, Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 1.3: share every page of the table with a new one");
    }
    // BEGIN SOLUTION
    for (i, &page) in table.pages().iter().enumerate() {
        if let Err(e) = pool.share(page) {
            pool.free_all(&table.pages()[..i])?;
            return Err(e);
        }
    }
    Ok(BlockTable::from_pages(
        table.pages().to_vec(),
        table.num_tokens(),
    ))
    // END SOLUTION
}

/// Grows `table` by one token and returns the slot to write, plus the copy to do first when
/// the last page was shared and had room: that page is swapped, in this table only, for a
/// fresh one (this table's holder of the old page is let go). A full last page needs no copy
/// (the token goes to a new page). On error (no free page) the table and pool are unchanged.
pub fn append_slot_cow(
    table: &mut BlockTable,
    pool: &mut KvPool,
) -> Result<(Slot, Option<PageCopy>), Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 1.3: append a slot, copying a shared last page first");
    }
    // BEGIN SOLUTION
    let ps = pool.page_size();
    let has_room = table.num_tokens() < table.capacity(ps);
    let shared_last = match table.pages().last() {
        Some(&last) if has_room && pool.ref_count(last)? > 1 => Some(last),
        _ => None,
    };
    let Some(from) = shared_last else {
        return Ok((table.append_slot(pool)?, None));
    };
    let to = pool.allocate()?;
    pool.free(from)?;
    let mut pages = table.pages().to_vec();
    *pages.last_mut().expect("a shared last page") = to;
    *table = BlockTable::from_pages(pages, table.num_tokens());
    Ok((table.append_slot(pool)?, Some(PageCopy { from, to })))
    // END SOLUTION
}
