//! The exercises of chapter 5: admission policies other than first come, first served.
//!
//! A policy runs before each step and reorders the scheduler's waiting queue
//! ([`Scheduler::sort_waiting_by_key`](crate::Scheduler::sort_waiting_by_key)); the step then
//! admits from the front as usual, so a policy changes who waits, never what anyone's tokens
//! are.
//!
//! Every body below starts as a `todo!("exercise 5.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase5 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod max_wait;
pub mod shortest_job_first;
