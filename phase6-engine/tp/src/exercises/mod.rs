//! The exercise of chapter 6.5: sharding a checkpoint as it is read.
//!
//! Every body below starts as a `todo!("exercise 6.5.k: ...")`; `tests/exercises.rs` checks
//! it: `cargo test -p phase6-tp --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod shard_tensor;
