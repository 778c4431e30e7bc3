//! The exercise of chapter 6.1: a policy put into the engine through its `StepDriver` seam.
//!
//! Every body below starts as a `todo!("exercise 6.1.k: ...")`; `tests/exercises.rs` checks
//! it: `cargo test -p phase6 --features exercises --test exercises`. The reference answers run
//! with `--features exercises,solutions`.

pub mod step_limit;
