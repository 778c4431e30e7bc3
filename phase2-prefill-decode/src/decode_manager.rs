//! The running sequences and their one-token-per-step decode.
//!
//! Every running sequence advances by exactly one token per decode step, so the step's cost
//! is dominated by reading the weights and every sequence's KV: decode is memory-bound, and
//! batching many sequences into one step is what makes it efficient. Growing by one token
//! needs a new page only when the last one is full; when none is free the sequence cannot
//! grow, and the manager reports it rather than failing (chapter 5 preempts it).

use phase0::SeqId;
use phase1::KvPool;

use crate::seq_state::SeqState;

/// Which running sequences got their slot this step and which could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodePlan {
    /// Indices into [`DecodeManager::running`] of sequences with a reserved slot.
    pub ready: Vec<usize>,
    /// Sequences left without a slot because the pool ran out of pages.
    pub blocked: Vec<SeqId>,
}

#[derive(Debug, Default)]
pub struct DecodeManager {
    running: Vec<SeqState>,
}

impl DecodeManager {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, state: SeqState) {
        self.running.push(state);
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn running(&self) -> &[SeqState] {
        &self.running
    }

    pub fn running_mut(&mut self) -> &mut [SeqState] {
        &mut self.running
    }

    /// Removes a running sequence (it finished, was aborted, or is being preempted).
    pub fn remove(&mut self, id: SeqId) -> Option<SeqState> {
        let i = self.running.iter().position(|s| s.id() == id)?;
        Some(self.running.remove(i))
    }

    /// Takes out every finished sequence, keeping the others in order.
    pub fn take_finished(&mut self) -> Vec<SeqState> {
        if !self.running.iter().any(|s| s.seq.is_finished()) {
            return Vec::new();
        }
        let (done, running) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| s.seq.is_finished());
        self.running = running;
        done
    }

    /// Reserves the slot of each running sequence's next token, oldest first.
    pub fn schedule(&mut self, pool: &mut KvPool) -> DecodePlan {
        // BEGIN SOLUTION
        let mut plan = DecodePlan::default();
        for (i, s) in self.running.iter_mut().enumerate() {
            match s.reserve(pool, 1) {
                Ok(()) => plan.ready.push(i),
                Err(_) => plan.blocked.push(s.id()),
            }
        }
        plan
        // END SOLUTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase0::{Request, SamplingParams, Sequence};

    /// A sequence whose prompt of `len` tokens is computed and that sampled one token.
    fn decoding(pool: &mut KvPool, id: u64, len: usize) -> SeqState {
        let seq = Sequence::new(Request::new(id, vec![1; len], SamplingParams::greedy())).unwrap();
        let mut s = SeqState::new(seq, 0);
        s.reserve(pool, len).unwrap();
        s.num_computed = len;
        s.seq.start().unwrap();
        s.seq.append_token(2, &[]).unwrap();
        s
    }

    #[test]
    fn one_slot_each_and_blocked_ones_reported() {
        let mut pool = KvPool::new(4, 4).unwrap();
        let mut m = DecodeManager::new();
        m.add(decoding(&mut pool, 1, 3)); // room left in its page
        m.add(decoding(&mut pool, 2, 4)); // page full: needs a new one
        m.add(decoding(&mut pool, 3, 4)); // page full, and none left after #2
        let plan = m.schedule(&mut pool);
        assert_eq!(plan.ready, vec![0, 1]);
        assert_eq!(plan.blocked, vec![3]);
        assert_eq!(pool.num_free(), 0);
        assert_eq!(m.running()[1].forward_seq(1).start_pos, 4);
    }

    #[test]
    fn finished_sequences_leave() {
        let mut pool = KvPool::new(4, 4).unwrap();
        let mut m = DecodeManager::new();
        m.add(decoding(&mut pool, 1, 2));
        m.add(decoding(&mut pool, 2, 2));
        m.running_mut()[0]
            .seq
            .finish(phase0::FinishReason::Length)
            .unwrap();
        let done = m.take_finished();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].id(), 1);
        assert_eq!(m.num_running(), 1);
        assert!(m.remove(2).is_some());
        assert!(m.remove(2).is_none());
    }
}
