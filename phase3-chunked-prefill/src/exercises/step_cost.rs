//! Exercise 3.3: a chunk size chosen from a latency target.
//!
//! Build: [`StepCost::fit`], a straight line `time = fixed + per_token * tokens` fitted by
//! least squares to measured steps, and [`StepCost::chunk_for_target`], the largest chunk
//! that keeps a step with a given number of decodes under a target time between tokens.
//!
//! Why: the chapter's table shows the trade: big chunks stall the decoding users, small ones
//! cost throughput. Sarathi-Serve turns it around and starts from the service-level target
//! (say 50 ms between tokens): profile the step time once, then give prefill whatever the
//! target leaves after the decodes. The fit is the profile; the chunk is the answer.
//!
//! Checked by `cargo test -p phase3 --features exercises --test exercises step_cost`.

/// The time of one step as a function of the tokens it computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Seconds every step costs whatever its size (weights read, launches, scheduling).
    pub fixed: f64,
    /// Seconds per token computed.
    pub per_token: f64,
}

impl StepCost {
    /// Predicted seconds for a step of `tokens` tokens.
    pub fn predict(&self, tokens: usize) -> f64 {
        self.fixed + self.per_token * tokens as f64
    }

    /// The least-squares line through `(tokens, seconds)` measurements; `None` unless at
    /// least two different token counts were measured (one point fixes no slope).
    pub fn fit(samples: &[(usize, f64)]) -> Option<StepCost> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 3.3: fit time = fixed + per_token * tokens by least squares");
        }
        // BEGIN SOLUTION
        let n = samples.len() as f64;
        let mean_x = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
        let mean_y = samples.iter().map(|s| s.1).sum::<f64>() / n;
        let sxx: f64 = samples.iter().map(|s| (s.0 as f64 - mean_x).powi(2)).sum();
        let sxy: f64 = samples
            .iter()
            .map(|s| (s.0 as f64 - mean_x) * (s.1 - mean_y))
            .sum();
        if samples.is_empty() || sxx == 0.0 {
            return None;
        }
        let per_token = sxy / sxx;
        Some(StepCost {
            fixed: mean_y - per_token * mean_x,
            per_token,
        })
        // END SOLUTION
    }

    /// The largest prefill chunk `c` with `predict(num_decoding + c) <= target`: 0 when the
    /// decodes alone reach the target, `usize::MAX` when tokens cost nothing.
    pub fn chunk_for_target(&self, num_decoding: usize, target: f64) -> usize {
        if !cfg!(feature = "solutions") {
            todo!("exercise 3.3: the largest chunk that keeps the step under the target");
        }
        // BEGIN SOLUTION
        if self.per_token <= 0.0 {
            return if self.predict(num_decoding) <= target {
                usize::MAX
            } else {
                0
            };
        }
        // Tokens the target allows in a step.
        let allowed = (target - self.fixed) / self.per_token;
        if allowed.is_nan() || allowed < num_decoding as f64 {
            return 0;
        }
        let mut c = allowed.floor() as usize - num_decoding;
        // Floating point may put the floor a token off either way: settle it exactly.
        while c > 0 && self.predict(num_decoding + c) > target {
            c -= 1;
        }
        while self.predict(num_decoding + c + 1) <= target {
            c += 1;
        }
        c
        // END SOLUTION
    }
}
