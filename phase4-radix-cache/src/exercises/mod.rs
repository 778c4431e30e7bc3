//! The exercises of chapter 4: another eviction policy, the hit rate as a function of the
//! page size, and an admission order that follows the cache.
//!
//! Every body below starts as a `todo!("exercise 4.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase4 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod hit_rate;
pub mod lfu;
pub mod longest_prefix_first;
