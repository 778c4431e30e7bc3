//! The `nanoserve` application: the command line over the engine of part 6.
//!
//! It is where the chapters meet: the engine (6.1) over the chunk runner (6.2) on the CPU or
//! the CUDA runner (6.4, feature `cuda`), served over HTTP (6.3), benchmarked with nano-vllm's
//! workload (`bench`) and compared chapter by chapter (`report`).

pub mod cli;
pub mod report;
pub mod runners;
pub mod workload;
