//! The exercises of chapter 3: two other ways to share a step's prefill budget among the
//! prompts in progress, and a chunk size chosen from a latency target.
//!
//! Both policies see the same picture as the chapter's round robin: which prompts are in
//! progress and how many tokens each still needs, and return this step's
//! [`PrefillChunk`](crate::PrefillChunk)s.
//!
//! Every body below starts as a `todo!("exercise 3.k: ...")`; `tests/exercises.rs` checks
//! them: `cargo test -p phase3 --features exercises --test exercises`. The reference answers
//! run with `--features exercises,solutions`.

pub mod fair_share;
pub mod shortest_first;
pub mod step_cost;

use phase0::SeqId;

/// A prompt in progress, as a chunk policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InProgress {
    pub seq_id: SeqId,
    /// Prompt tokens still to compute.
    pub remaining: usize,
}
