//! Exercise 3.1: shortest remaining prompt first.
//!
//! Build: [`shortest_first`], a chunk policy that serves the prompts closest to done first:
//! fewest remaining tokens first (equal ones: the older, lower id, first), each taking up to
//! `chunk_size` tokens while the budget lasts.
//!
//! Why: finishing short prompts first minimises the mean time to first token, the way
//! shortest-remaining-time-first minimises mean completion time on one processor. The
//! tests measure it against the chapter's round robin, and show the price: under a steady
//! stream of short prompts a long one never gets a token. Round robin is what guarantees
//! every prompt progress.
//!
//! Checked by `cargo test -p phase3 --features exercises --test exercises shortest_first`.

use super::InProgress;
use crate::PrefillChunk;

/// This step's chunks under shortest-remaining-first, in the order served. Prompts with
/// nothing remaining get no chunk; at most one prompt (the last served) gets less than
/// `min(chunk_size, remaining)`, because the budget ran out.
pub fn shortest_first(
    prompts: &[InProgress],
    budget: usize,
    chunk_size: usize,
) -> Vec<PrefillChunk> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 3.1: serve the prompts with the fewest remaining tokens first");
    }
    // BEGIN SOLUTION
    let mut order: Vec<&InProgress> = prompts.iter().filter(|p| p.remaining > 0).collect();
    order.sort_by_key(|p| (p.remaining, p.seq_id));
    let mut left = budget;
    let mut chunks = Vec::new();
    for p in order {
        let n = p.remaining.min(chunk_size).min(left);
        if n == 0 {
            break;
        }
        chunks.push(PrefillChunk {
            seq_id: p.seq_id,
            num_tokens: n,
        });
        left -= n;
    }
    chunks
    // END SOLUTION
}
