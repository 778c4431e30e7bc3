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

/// The gap between the largest logit and the next: where it is small, rounding in another
/// order of additions (another backend, another split) may swap the greedy token.
pub fn top2_gap(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in logits {
        if x > first {
            (first, second) = (x, first);
        } else if x > second {
            second = x;
        }
    }
    first - second
}

/// Samples one token id from a row of logits.
///
/// The procedure is fixed so that every backend can follow it exactly: top-k and top-p only
/// decide a logit *threshold* (the candidates are every token whose logit reaches it); the
/// draw then walks the candidates in vocabulary order, not sorted order, which a GPU does
/// with one prefix sum instead of a sort.
pub fn sample(logits: &[f32], spec: &SampleSpec) -> TokenId {
    // BEGIN SOLUTION
    if spec.temperature == 0.0 {
        return argmax(logits);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weight = |x: f32| ((x - max) / spec.temperature).exp();
    let threshold = keep_threshold(logits, spec, max);

    // Sums in f64: over a 150k-token vocabulary f32 running sums drift by ~1e-4, enough to
    // move a draw to a neighbouring token.
    let kept_mass: f64 = logits
        .iter()
        .filter(|&&x| x >= threshold)
        .map(|&x| weight(x) as f64)
        .sum();
    let target = uniform(spec.seed, spec.step) as f64 * kept_mass;
    let mut cumulative = 0.0f64;
    let mut last_kept = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x >= threshold {
            cumulative += weight(x) as f64;
            last_kept = i;
            if target < cumulative {
                return i as TokenId;
            }
        }
    }
    // Rounding can leave `target` a hair above the final sum: the last candidate takes it.
    last_kept as TokenId
    // END SOLUTION
}

/// The smallest logit still a candidate after top-k and top-p (`-inf` when both are off).
fn keep_threshold(logits: &[f32], spec: &SampleSpec, max: f32) -> f32 {
    let top_k_on = spec.top_k > 0 && (spec.top_k as usize) < logits.len();
    if !top_k_on && spec.top_p >= 1.0 {
        return f32::NEG_INFINITY;
    }
    // BEGIN SOLUTION
    let mut sorted: Vec<f32> = logits.to_vec();
    sorted.sort_unstable_by(|a, b| b.total_cmp(a));
    if top_k_on {
        sorted.truncate(spec.top_k as usize);
    }
    if spec.top_p < 1.0 {
        // Top-p over the top-k survivors: the shortest head whose probability reaches top_p.
        let weights: Vec<f64> = sorted
            .iter()
            .map(|&x| ((x - max) / spec.temperature).exp() as f64)
            .collect();
        let total: f64 = weights.iter().sum();
        let mut mass = 0.0;
        for (i, w) in weights.iter().enumerate() {
            mass += w / total;
            if mass >= spec.top_p as f64 {
                sorted.truncate(i + 1);
                break;
            }
        }
    }
    *sorted.last().expect("at least one candidate")
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
    fn the_top_two_gap_counts_a_repeated_maximum_as_no_gap() {
        assert_eq!(top2_gap(&[1.0, 3.0, 2.5]), 0.5);
        assert_eq!(top2_gap(&[2.5, 1.0, 3.0]), 0.5);
        assert_eq!(top2_gap(&[3.0, 0.0, 3.0]), 0.0);
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
