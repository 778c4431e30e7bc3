//! The exercises of chapter 0: features the reference engines have and this chapter does not.
//!
//! Every function below starts as a `todo!("exercise 0.k: ...")`; `tests/exercises.rs` checks
//! them all: `cargo test -p phase0 --features exercises --test exercises`. The reference
//! answers run with `--features exercises,solutions`.

pub mod min_tokens;
pub mod parallel_sampling;
pub mod stop_strings;
