//! Chapter 6: the engine.
//!
//! The public face of nano-serving: [`LLM`] (generate, the step API, streaming) over the
//! continuous-batching engine of chapter 5, the chunk API with cascade attention, direct
//! inference from KV blocks, the `nanoserve` command line, and the CUDA runner.

pub mod cascade;
mod chunks;
pub mod cli;
mod config;
#[cfg(feature = "cuda")]
mod cuda_runner;
mod error;
#[cfg(feature = "exercises")]
pub mod exercises;
mod llm;
mod prompt;
pub mod report;
mod runner_select;
pub mod server;
mod stream;
pub mod workload;

pub use chunks::{
    Chunk, ChunkConfig, ChunkFilter, ChunkInfo, ChunkOutput, ChunkStats, ChunkType, ChunkedLLM,
    Composition, CompositionMode, CompositionPreview, KvBlocks, QueuedFromChunks, VirtualSequence,
    metadata_map,
};
pub use config::{Config, Device};
#[cfg(feature = "cuda")]
pub use cuda_runner::{CudaOptions, CudaRunner, MemoryReport, TunedStep};
pub use error::Error;
pub use llm::{LLM, StepResult};
pub use phase0::{FinishReason, SamplingParams, SeqId, TokenId};
pub use phase2::{ChatMessage, default_model_dir, models_dir};
pub use prompt::{Output, ParamsList, Prompt};
pub use runner_select::{Runner, build_runner, cpu_runner};
pub use stream::{StreamPiece, TokenStream};
