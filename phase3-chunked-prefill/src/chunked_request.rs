//! A prompt being prefilled piece by piece.

use phase2::SeqState;

/// A sequence in its prefill phase, with how far its prompt has got.
#[derive(Debug, Clone)]
pub struct ChunkedRequest {
    pub state: SeqState,
}

impl ChunkedRequest {
    pub fn new(state: SeqState) -> Self {
        Self { state }
    }

    /// Prompt tokens (shared prefix included) whose K/V is computed.
    pub fn prefilled(&self) -> usize {
        self.state.num_computed
    }

    /// Prompt tokens still to compute.
    pub fn remaining(&self) -> usize {
        self.state.num_uncomputed()
    }

    /// The size of its next chunk under a per-request cap and what is left of the budget.
    pub fn next_chunk(&self, chunk_size: usize, budget: usize) -> usize {
        self.remaining().min(chunk_size).min(budget)
    }
}
