//! Chapter 6.2: the chunk API, cascade attention and inference from KV blocks.
//!
//! Agents and RAG systems send the same system prompt and documents again and again with a
//! new question. [`ChunkedLLM`] registers such pieces once (their tokens and K/V pages) and
//! composes requests from them, computing only what is new. Requests that read the same chunk
//! are attended with cascade attention ([`cascade`]); a chunk's K/V can be moved to another
//! position by turning its keys' rotation ([`ChunkRunner::copy_kv`]). The runner an engine of
//! this chapter needs is a [`ChunkRunner`]: [`CascadeCpuRunner`] on the CPU, the CUDA runner of
//! chapter 6.4 on a GPU.

pub mod cascade;
mod chunked_llm;
mod cpu;
#[cfg(feature = "exercises")]
pub mod exercises;
mod store;
mod types;

pub use cascade::{CascadeStats, SharedSegment, plan_cascade};
pub use chunked_llm::{ChunkLLM, ChunkedLLM, QueuedFromChunks, VirtualSequence, cpu_chunk_llm};
pub use cpu::{CascadeCpuRunner, chunk_cpu_runner, copy_kv_rotated, merge_states};
pub use store::metadata_map;
pub use types::{
    Chunk, ChunkConfig, ChunkFilter, ChunkInfo, ChunkOutput, ChunkStats, ChunkType, Composition,
    CompositionMode, CompositionPreview, KvBlocks,
};

use phase1::BlockTable;
use phase2::{Error, ModelRunner};

/// What the chunk API needs of a runner beyond chapter 2's [`ModelRunner`]: its `forward`
/// plans cascade attention for segments its sequences share ([`plan_cascade`]), and it can copy
/// K/V between pages with a RoPE shift.
pub trait ChunkRunner: ModelRunner {
    /// Copies the K/V of `src` into the slots of `dst` (same token count), turning the keys'
    /// rotary positions by `rope_shift`: K/V computed at positions `0..n` becomes the K/V of the
    /// same tokens at `shift..shift + n` (RoPE composes, so this is exact). The independent
    /// mode places a chunk prefilled on its own after other chunks this way.
    fn copy_kv(&mut self, src: &BlockTable, dst: &BlockTable, rope_shift: i64)
    -> Result<(), Error>;

    /// What cascade planning found so far.
    fn cascade_stats(&self) -> CascadeStats;
}

/// Checks the arguments of [`ChunkRunner::copy_kv`] against a store of `num_pages` pages of
/// `page_size` tokens: both segments hold the same number of tokens, have the pages for them,
/// and name only pages of the store. Every runner's `copy_kv` starts with it.
pub fn check_copy_kv(
    src: &BlockTable,
    dst: &BlockTable,
    page_size: usize,
    num_pages: usize,
) -> Result<(), Error> {
    let n = src.num_tokens();
    if dst.num_tokens() != n
        || src.pages().len() * page_size < n
        || dst.pages().len() * page_size < n
    {
        return Err(Error::InvalidBatch(format!(
            "copy of {n} tokens into a segment of {}",
            dst.num_tokens()
        )));
    }
    let limit = num_pages as u32;
    if src.pages().iter().chain(dst.pages()).any(|&p| p >= limit) {
        return Err(Error::InvalidBatch(
            "copy names a page outside the store".into(),
        ));
    }
    Ok(())
}
