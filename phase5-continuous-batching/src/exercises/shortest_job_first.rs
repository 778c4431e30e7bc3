//! Exercise 5.1: shortest job first.
//!
//! Build: [`job_size`], the work a waiting request still needs as far as the scheduler can
//! know it (its tokens to compute before the next sample, plus the tokens it may still
//! generate, taking `max_tokens` at its word), and [`shortest_job_first`], which puts the
//! smallest jobs at the front of the waiting queue.
//!
//! Why: when seats are scarce, serving short requests first minimises the mean latency
//! (every request that waits behind a long one pays its whole length). The tests measure it
//! against first come, first served, and show the catch: a long request can wait forever
//! behind a steady stream of short ones. Exercise 5.2 is the fix.
//!
//! Checked by `cargo test -p phase5 --features exercises --test exercises shortest_job_first`.

use phase2::SeqState;

use crate::Scheduler;

/// Tokens still to compute before its next sample plus the output tokens it may still
/// produce (`max_tokens` minus those it has).
pub fn job_size(state: &SeqState) -> usize {
    if !cfg!(feature = "solutions") {
        todo!("exercise 5.1: the work left in a waiting request");
    }
    // BEGIN SOLUTION
    let generated = state.seq.output().len();
    state.num_uncomputed() + state.seq.params().max_tokens.saturating_sub(generated)
    // END SOLUTION
}

/// Reorders the waiting queue by [`job_size`], smallest first; equal jobs keep their order.
pub fn shortest_job_first(scheduler: &mut Scheduler) {
    if !cfg!(feature = "solutions") {
        todo!("exercise 5.1: put the smallest jobs at the front of the waiting queue");
    }
    // BEGIN SOLUTION
    scheduler.sort_waiting_by_key(job_size);
    // END SOLUTION
}
