//! Benchmark workloads and the statistics reported about them.
//!
//! The throughput workload is nano-vllm's: `num_seqs` prompts of random token ids with random
//! lengths, each with its own random output length, `ignore_eos` so every request produces
//! exactly its length; all drawn from one seed so that runs and engines are comparable.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use phase0::{SamplingParams, TokenId};

/// The shape of a throughput run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WorkloadSpec {
    pub num_seqs: usize,
    pub min_input: usize,
    pub max_input: usize,
    pub min_output: usize,
    pub max_output: usize,
    pub seed: u64,
    /// nano-vllm samples at 0.6; 0 makes the run greedy.
    pub temperature: f32,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        Self {
            num_seqs: 256,
            min_input: 100,
            max_input: 1024,
            min_output: 100,
            max_output: 1024,
            seed: 0,
            temperature: 0.6,
        }
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    pub prompt: Vec<TokenId>,
    pub params: SamplingParams,
}

impl WorkloadSpec {
    /// The requests, with token ids below `min(vocab_size, 10000)` as nano-vllm draws them.
    pub fn build(&self, vocab_size: usize) -> Vec<WorkItem> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let top = vocab_size.min(10_000) as TokenId;
        (0..self.num_seqs)
            .map(|i| {
                let len = rng.random_range(self.min_input..=self.max_input);
                let prompt = (0..len).map(|_| rng.random_range(0..top)).collect();
                let max_tokens = rng.random_range(self.min_output..=self.max_output);
                let params = SamplingParams::default()
                    .with_temperature(self.temperature)
                    .with_ignore_eos(true)
                    .with_max_tokens(max_tokens)
                    .with_seed(self.seed.wrapping_add(i as u64));
                WorkItem { prompt, params }
            })
            .collect()
    }
}

/// p50, p99 and mean of a set of durations in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Self::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Self {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_is_reproducible_and_in_range() {
        let spec = WorkloadSpec {
            num_seqs: 50,
            ..WorkloadSpec::default()
        };
        let a = spec.build(2048);
        assert_eq!(a, spec.build(2048));
        assert!(a.iter().all(|w| (100..=1024).contains(&w.prompt.len())));
        assert!(
            a.iter()
                .all(|w| (100..=1024).contains(&w.params.max_tokens) && w.params.ignore_eos)
        );
        assert!(a.iter().flat_map(|w| &w.prompt).all(|&t| t < 2048));
    }

    #[test]
    fn percentiles() {
        let p = Percentiles::of(&(1..=100).map(f64::from).collect::<Vec<_>>());
        assert_eq!((p.p50, p.p99, p.mean), (51.0, 99.0, 50.5));
    }
}
