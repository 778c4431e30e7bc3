//! Exercise 2.3: log-probabilities, and a check that greedy and sampled tokens agree with
//! them.
//!
//! Build: [`log_softmax`] (stable for any logits, even ones in the thousands) and
//! [`top_logprobs`], the `n` most likely tokens with their log-probabilities, as the OpenAI
//! API returns them with each token (`logprobs`, `top_logprobs`).
//!
//! Why: clients score answers, build classifiers and detect uncertainty from these numbers,
//! and they are a check on the sampler: a greedy token must always be the top entry, and a
//! token sampled with top-k must always be among the top `k`.
//!
//! Checked by `cargo test -p phase2 --features exercises --test exercises logprobs` (its model
//! tests run on exercise 2.2's `generate`).

use phase0::TokenId;

/// `x_i - log Σ_j exp(x_j)` for every `i`, computed without overflow or lost digits:
/// subtract the maximum first. Minus-infinity logits give minus infinity.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.3: a numerically stable log-softmax");
    }
    // BEGIN SOLUTION
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Shift first and add `max` back never: near 1000 an f32 keeps only 4 decimals.
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let log_sum = sum.ln() as f32;
    logits.iter().map(|&x| (x - max) - log_sum).collect()
    // END SOLUTION
}

/// The `n` most likely tokens (fewer if the vocabulary is smaller) with their
/// log-probabilities, most likely first; equal ones in id order.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(TokenId, f32)> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.3: the n most likely tokens with their log-probabilities");
    }
    // BEGIN SOLUTION
    let mut ranked: Vec<(TokenId, f32)> = log_softmax(logits)
        .into_iter()
        .enumerate()
        .map(|(i, lp)| (i as TokenId, lp))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.truncate(n);
    ranked
    // END SOLUTION
}
