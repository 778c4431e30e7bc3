//! Picking the next token from logits: greedy, or temperature + top-k + top-p.
//!
//! The random draw is a pure function of the request's seed and the token's index in the
//! output (a SplitMix64 hash), not a stream advanced by every call. So a seeded request gives
//! the same tokens alone or in any batch, after a preemption, and on any backend that
//! computes the same probabilities.

use phase0::TokenId;

use crate::runner::SampleSpec;

/// SplitMix64's finaliser: a fast, well-mixed 64-bit hash.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The uniform number in [0, 1) used for output token `step` of a request seeded `seed`.
pub fn uniform(seed: u64, step: u64) -> f32 {
    let bits = splitmix64(seed ^ splitmix64(step));
    // 24 random bits: every value is exactly representable as an f32 below 1.
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as TokenId
}

/// Samples one token id from a row of logits.
pub fn sample(logits: &[f32], spec: &SampleSpec) -> TokenId {
    // BEGIN SOLUTION
    if spec.temperature == 0.0 {
        return argmax(logits);
    }
    // Candidates sorted by logit, highest first; top-k keeps only the first k.
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit_desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if spec.top_k > 0 && (spec.top_k as usize) < order.len() {
        let k = spec.top_k as usize;
        order.select_nth_unstable_by(k - 1, by_logit_desc);
        order.truncate(k);
    }
    order.sort_unstable_by(by_logit_desc);

    // Softmax of logits / temperature over the candidates (shifted by the max for stability).
    let max = logits[order[0] as usize];
    let mut probs: Vec<f32> = order
        .iter()
        .map(|&i| ((logits[i as usize] - max) / spec.temperature).exp())
        .collect();
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);

    // Top-p: the smallest head of the sorted list whose mass reaches top_p.
    let mut keep = probs.len();
    if spec.top_p < 1.0 {
        let mut mass = 0.0;
        for (i, p) in probs.iter().enumerate() {
            mass += p;
            if mass >= spec.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    let kept_mass: f32 = probs[..keep].iter().sum();

    // Walk the cumulative distribution up to the uniform draw.
    let target = uniform(spec.seed, spec.step) * kept_mass;
    let mut cumulative = 0.0;
    for (i, p) in probs[..keep].iter().enumerate() {
        cumulative += p;
        if target < cumulative {
            return order[i];
        }
    }
    order[keep - 1]
    // END SOLUTION
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(temperature: f32, top_k: i32, top_p: f32, seed: u64) -> SampleSpec {
        SampleSpec {
            temperature,
            top_k,
            top_p,
            seed,
            step: 0,
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(sample(&[0.1, 3.0, 2.0], &SampleSpec::greedy()), 1);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_seed() {
        let logits = [0.5, 0.1, 2.0, 1.9];
        for seed in 0..50 {
            assert_eq!(sample(&logits, &spec(1.0, 1, 1.0, seed)), 2);
        }
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // Probabilities about 0.64, 0.24, 0.09, 0.03: top_p 0.7 keeps the first two only.
        let logits = [3.0, 2.0, 1.0, 0.0];
        for seed in 0..200 {
            let t = sample(&logits, &spec(1.0, -1, 0.7, seed));
            assert!(t == 0 || t == 1, "seed {seed} drew {t}");
        }
    }

    #[test]
    fn same_seed_and_step_same_token_and_frequencies_follow_softmax() {
        let logits = [1.0f32, 0.0, 2.0];
        let s = spec(1.0, -1, 1.0, 42);
        assert_eq!(sample(&logits, &s), sample(&logits, &s));
        let n = 20_000;
        let mut counts = [0usize; 3];
        for step in 0..n {
            let s = SampleSpec { step, ..s };
            counts[sample(&logits, &s) as usize] += 1;
        }
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        for (i, &c) in counts.iter().enumerate() {
            let expected = logits[i].exp() / z;
            let seen = c as f32 / n as f32;
            assert!(
                (seen - expected).abs() < 0.02,
                "token {i}: {seen} vs {expected}"
            );
        }
    }

    #[test]
    fn uniform_draws_are_in_range_and_differ_by_step() {
        let draws: Vec<f32> = (0..1000).map(|s| uniform(7, s)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f32>() / draws.len() as f32;
        assert!((mean - 0.5).abs() < 0.05);
        assert_ne!(uniform(7, 0), uniform(7, 1));
        assert_ne!(uniform(7, 0), uniform(8, 0));
    }
}
