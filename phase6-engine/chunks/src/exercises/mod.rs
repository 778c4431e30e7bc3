//! The exercise of chapter 6.2: a policy the chunk store needs around the model.
//!
//! Every body below starts as a `todo!("exercise 6.2.k: ...")`; `tests/exercises.rs` checks
//! it: `cargo test -p phase6-chunks --features exercises --test exercises`. The reference
//! answers run with `--features exercises,solutions`.

pub mod chunk_eviction;
