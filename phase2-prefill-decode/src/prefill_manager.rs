//! Admitting waiting prompts: first come, first served, within a token budget.
//!
//! A prefill step processes whole prompts, so what limits it is the number of tokens it
//! computes (`max_num_batched_tokens`: the compute budget of one step), the number of
//! sequences that may run at once (`max_num_seqs`), and the free KV pages (each admitted
//! prompt reserves its pages before it runs). Admission stops at the first prompt that does
//! not fit, so no later request overtakes an earlier one: nano-vllm's and vLLM's v0 policy.

use std::collections::VecDeque;

use phase1::KvPool;

use crate::error::Error;
use crate::seq_state::SeqState;

/// The limits of one scheduling step, with the reference engines' defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillConfig {
    /// Most tokens computed in one step.
    pub max_num_batched_tokens: usize,
    /// Most sequences running (prefill or decode) at once.
    pub max_num_seqs: usize,
}

impl Default for PrefillConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
        }
    }
}

/// The waiting queue and its admission rule.
#[derive(Debug, Default)]
pub struct PrefillManager {
    config: PrefillConfig,
    waiting: VecDeque<SeqState>,
}

impl PrefillManager {
    pub fn new(config: PrefillConfig) -> Self {
        Self {
            config,
            waiting: VecDeque::new(),
        }
    }

    pub fn config(&self) -> PrefillConfig {
        self.config
    }

    /// Queues a new sequence. A prompt longer than the step budget could never be admitted
    /// whole, so it is refused now (chapter 3's chunked prefill lifts this limit).
    pub fn add(&mut self, state: SeqState) -> Result<(), Error> {
        let len = state.num_uncomputed();
        if len > self.config.max_num_batched_tokens {
            return Err(Error::PromptTooLong {
                len,
                max: self.config.max_num_batched_tokens,
            });
        }
        self.waiting.push_back(state);
        Ok(())
    }

    /// Puts a preempted sequence back at the front: it was admitted before everyone waiting.
    pub fn push_front(&mut self, state: SeqState) {
        self.waiting.push_front(state);
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn waiting(&self) -> impl Iterator<Item = &SeqState> {
        self.waiting.iter()
    }

    /// Removes a waiting sequence (an abort).
    pub fn remove(&mut self, id: phase0::SeqId) -> Option<SeqState> {
        let i = self.waiting.iter().position(|s| s.id() == id)?;
        self.waiting.remove(i)
    }

    /// Admits prompts from the front of the queue while they fit, reserving their pages.
    /// `num_running` is how many sequences already hold a seat.
    pub fn schedule(&mut self, pool: &mut KvPool, num_running: usize) -> Vec<SeqState> {
        // BEGIN SOLUTION
        let mut admitted = Vec::new();
        let mut tokens = 0;
        while let Some(next) = self.waiting.front_mut() {
            let need = next.num_uncomputed();
            let fits_budget = tokens + need <= self.config.max_num_batched_tokens;
            let has_seat = num_running + admitted.len() < self.config.max_num_seqs;
            if !fits_budget || !has_seat || next.reserve(pool, need).is_err() {
                break;
            }
            tokens += need;
            admitted.push(self.waiting.pop_front().expect("front exists"));
        }
        admitted
        // END SOLUTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase0::{Request, SamplingParams, Sequence};

    fn state(id: u64, len: usize) -> SeqState {
        let seq = Sequence::new(Request::new(id, vec![1; len], SamplingParams::greedy())).unwrap();
        SeqState::new(seq, id)
    }

    fn ids(states: &[SeqState]) -> Vec<u64> {
        states.iter().map(SeqState::id).collect()
    }

    #[test]
    fn fcfs_within_the_token_budget() {
        let mut m = PrefillManager::new(PrefillConfig {
            max_num_batched_tokens: 10,
            max_num_seqs: 8,
        });
        let mut pool = KvPool::new(100, 4).unwrap();
        for (id, len) in [(1, 4), (2, 5), (3, 2), (4, 1)] {
            m.add(state(id, len)).unwrap();
        }
        // 4 + 5 = 9 fits; 3 would make 11: stop there, even though 4 alone would fit.
        assert_eq!(ids(&m.schedule(&mut pool, 0)), vec![1, 2]);
        assert_eq!(ids(&m.schedule(&mut pool, 2)), vec![3, 4]);
        assert_eq!(m.num_waiting(), 0);
    }

    #[test]
    fn seats_and_pages_limit_admission() {
        let mut m = PrefillManager::new(PrefillConfig {
            max_num_batched_tokens: 100,
            max_num_seqs: 2,
        });
        let mut pool = KvPool::new(3, 4).unwrap();
        for id in 1..=3 {
            m.add(state(id, 4)).unwrap();
        }
        assert_eq!(ids(&m.schedule(&mut pool, 1)), vec![1], "one seat left");
        assert_eq!(pool.num_free(), 2);
        m.add(state(9, 12)).unwrap();
        let admitted = m.schedule(&mut pool, 0);
        assert_eq!(ids(&admitted), vec![2, 3]);
        assert!(
            m.schedule(&mut pool, 0).is_empty(),
            "12 tokens need 3 pages, none free"
        );
        assert_eq!(m.num_waiting(), 1);
    }

    #[test]
    fn a_prompt_over_the_budget_is_refused_at_once() {
        let mut m = PrefillManager::new(PrefillConfig {
            max_num_batched_tokens: 8,
            max_num_seqs: 8,
        });
        let err = m.add(state(1, 9)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "prompt of 9 tokens is longer than the limit of 8"
        );
    }
}
