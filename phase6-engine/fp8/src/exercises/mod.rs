//! The exercise of chapter 6.6: the other 8-bit float, E5M2.
//!
//! Every body below starts as a `todo!("exercise 6.6.k: ...")`; `tests/exercises.rs` checks
//! it: `cargo test -p phase6-fp8 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod e5m2;
