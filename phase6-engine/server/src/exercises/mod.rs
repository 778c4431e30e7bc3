//! The exercise of chapter 6.3: a policy the server needs in front of the engine.
//!
//! Every body below starts as a `todo!("exercise 6.3.k: ...")`; `tests/exercises.rs` checks
//! it: `cargo test -p phase6-server --features exercises --test exercises`. The reference
//! answers run with `--features exercises,solutions`.

pub mod token_bucket;
