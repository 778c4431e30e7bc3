//! The exercises of chapter 6: policies a serving engine needs around the model.
//!
//! Every body below starts as a `todo!("exercise 6.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase6 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod chunk_eviction;
pub mod token_bucket;
