//! The exercises of chapter 1: measuring what paging wastes, keeping a reserve for decode,
//! and sharing a whole sequence until one copy writes.
//!
//! Every body below starts as a `todo!("exercise 1.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase1 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod copy_on_write;
pub mod page_size_sweep;
pub mod watermark;
