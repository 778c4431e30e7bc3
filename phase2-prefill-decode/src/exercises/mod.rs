//! The exercises of chapter 2: a sampling rule the reference engines have, a generation loop
//! of your own over paged KV with a penalty on repeats, and the log-probabilities an API
//! returns with each token.
//!
//! Every body below starts as a `todo!("exercise 2.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase2 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`. The model tests of 2.3 run on the loop of 2.2,
//! so do 2.2 first.

pub mod logprobs;
pub mod min_p;
pub mod repetition_penalty;
