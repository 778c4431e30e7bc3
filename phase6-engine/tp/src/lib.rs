//! Chapter 6.5: tensor parallelism.
//!
//! One model split over several devices that compute every step together (Megatron-LM's
//! tensor parallelism, as vLLM and SGLang serve models larger than one GPU): [`shard`] says who
//! holds which weights, [`collective`] the two operations the ranks need from each other, and
//! [`TpCpuRunner`] runs the ranks as threads on the CPU, where every step can be checked
//! against the single-rank runner. With the `cuda` feature, [`cuda::TpCudaRunner`] runs them
//! on GPUs, one thread per GPU, exchanging through NCCL.

pub mod collective;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "exercises")]
pub mod exercises;
mod runner;
pub mod shard;

pub use collective::{Collective, ThreadGroup};
pub use runner::{TpCpuRunner, tp_cpu_runner};
pub use shard::{Shard, check_split};
