//! The errors of chapter 1. Running out of pages is an ordinary event for a scheduler
//! (it then waits or preempts), so it is a value, never a panic.

use crate::kv_pool::PageId;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("out of KV pages: {requested} requested, {free} free of {total}")]
    OutOfPages {
        requested: usize,
        free: usize,
        total: usize,
    },
    #[error("page {0} is not allocated (freed twice, or shared after its last free)")]
    NotAllocated(PageId),
    #[error("page {page} does not exist in a pool of {num_pages} pages")]
    NoSuchPage { page: PageId, num_pages: usize },
    #[error("invalid pool shape: {0}")]
    InvalidShape(String),
}
