//! Exercise 3.2: an equal share of the budget for every prompt in progress.
//!
//! Build: [`fair_share`], which gives every prompt in progress the same number of tokens
//! this step (processor sharing), water-filling style: a prompt that needs less than its
//! share (or is capped by `chunk_size`) takes what it needs, and what it leaves is shared
//! again among the others, until the budget is spent or nobody can take more. Shares are
//! whole tokens: a remainder goes one token each to the first prompts in the given order.
//!
//! Why: round robin serves prompts a chunk at a time, so with a budget of four chunks and
//! ten prompts six of them wait this step. An equal split moves every prompt forward every
//! step, which keeps the time to first token of prompts of similar length close together,
//! at the cost of finishing none of them early.
//!
//! Checked by `cargo test -p phase3 --features exercises --test exercises fair_share`.

use super::InProgress;
use crate::PrefillChunk;

/// This step's chunks under an equal split, in the order of `prompts`; prompts that get no
/// token are left out. The chunks never exceed `budget` in total, nor any prompt's
/// `min(chunk_size, remaining)`.
pub fn fair_share(prompts: &[InProgress], budget: usize, chunk_size: usize) -> Vec<PrefillChunk> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 3.2: split the budget evenly, giving back what capped prompts leave");
    }
    // BEGIN SOLUTION
    let caps: Vec<usize> = prompts
        .iter()
        .map(|p| p.remaining.min(chunk_size))
        .collect();
    let mut given = vec![0usize; prompts.len()];
    let mut left = budget;
    loop {
        let open: Vec<usize> = (0..prompts.len()).filter(|&i| given[i] < caps[i]).collect();
        if open.is_empty() || left == 0 {
            break;
        }
        let share = left / open.len();
        if share == 0 {
            // Fewer tokens than open prompts: one each, in order.
            for &i in open.iter().take(left) {
                given[i] += 1;
            }
            break;
        }
        for &i in &open {
            let n = share.min(caps[i] - given[i]);
            given[i] += n;
            left -= n;
        }
    }
    prompts
        .iter()
        .zip(given)
        .filter(|(_, n)| *n > 0)
        .map(|(p, n)| PrefillChunk {
            seq_id: p.seq_id,
            num_tokens: n,
        })
        .collect()
    // END SOLUTION
}
