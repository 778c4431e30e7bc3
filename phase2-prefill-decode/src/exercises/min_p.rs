//! Exercise 2.1: min-p sampling.
//!
//! Build: [`apply_min_p`], which removes from the candidates every token whose probability
//! (at the request's temperature) is below `min_p` times the probability of the most likely
//! token, and [`sample_min_p`], chapter 2's sampler with that rule in front.
//!
//! Why: top-p keeps a fixed share of the probability mass, so when the model is unsure it
//! lets in a long tail of poor tokens, and when it is sure it still cuts nothing. Min-p scales
//! with the model's confidence: a confident step keeps one or two tokens, an unsure one many.
//! vLLM, SGLang and llama.cpp all offer it (`min_p`).
//!
//! Hint: `p_i / p_max = exp((x_i - x_max) / T)`, so the rule is a threshold on the logit,
//! and a logit set to minus infinity is a token the sampler can never draw.
//!
//! Checked by `cargo test -p phase2 --features exercises --test exercises min_p`.

use phase0::TokenId;

use crate::SampleSpec;
use crate::sampler;

/// Refuses a `min_p` outside `[0, 1]` with an error naming the field `"min_p"`.
pub fn validate_min_p(min_p: f32) -> Result<(), phase0::Error> {
    if (0.0..=1.0).contains(&min_p) {
        Ok(())
    } else {
        Err(phase0::Error::InvalidSamplingParams {
            field: "min_p",
            value: min_p.to_string(),
            reason: "must be in [0, 1]",
        })
    }
}

/// Sets to minus infinity the logits of tokens less likely than `min_p` times the most
/// likely one, at `temperature`. Greedy decoding (temperature 0) and `min_p == 0` change
/// nothing; the most likely token always stays.
pub fn apply_min_p(logits: &mut [f32], temperature: f32, min_p: f32) {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.1: mask the tokens below min_p times the top probability");
    }
    // BEGIN SOLUTION
    if temperature == 0.0 || min_p <= 0.0 {
        return;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let threshold = max + temperature * min_p.ln();
    for x in logits.iter_mut().filter(|x| **x < threshold) {
        *x = f32::NEG_INFINITY;
    }
    // END SOLUTION
}

/// Samples like [`sampler::sample`] after [`apply_min_p`] (on a copy: `logits` is kept).
pub fn sample_min_p(logits: &[f32], spec: &SampleSpec, min_p: f32) -> TokenId {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.1: min-p, then the chapter's sampler");
    }
    // BEGIN SOLUTION
    let mut kept = logits.to_vec();
    apply_min_p(&mut kept, spec.temperature, min_p);
    sampler::sample(&kept, spec)
    // END SOLUTION
}
