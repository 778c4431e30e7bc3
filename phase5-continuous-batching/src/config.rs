//! The scheduler's knobs, with the reference engines' defaults.

/// When new requests may join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// At any step (Orca / vLLM).
    Continuous,
    /// Only when the previous batch has completely finished: the baseline it replaces.
    Static,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens computed in one step, decodes included.
    pub max_num_batched_tokens: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Most prompt tokens a request gets per step; `None` prefills whole prompts.
    pub chunk_size: Option<usize>,
    /// Reuse the K/V of earlier requests' prefixes through the radix cache.
    pub enable_prefix_caching: bool,
    pub batching: Batching,
    /// Longest sequence (prompt + output) the model may see.
    pub max_model_len: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
            chunk_size: Some(512),
            enable_prefix_caching: true,
            batching: Batching::Continuous,
            max_model_len: 4096,
        }
    }
}
