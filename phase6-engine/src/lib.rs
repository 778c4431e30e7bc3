//! Chapter 6: the engine.
//!
//! The public face of nano-serving: `LLM` (generate, add_request / step, streaming) over the
//! continuous-batching engine of chapter 5, the chunk API with cascade attention, direct
//! inference from KV blocks, the `nanoserve` command line, and the CUDA runner.

#[cfg(feature = "cuda")]
pub mod cuda_runner;
#[cfg(feature = "cuda")]
pub use cuda_runner::{CudaOptions, CudaRunner, MemoryReport};
