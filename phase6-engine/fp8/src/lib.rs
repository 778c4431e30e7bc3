//! Chapter 6.6: an FP8 K/V cache.
//!
//! Decode reads every stored key and value of every sequence at every step, so the bytes per
//! K/V element bound how fast it can go and how many tokens fit. vLLM and SGLang store K/V as
//! 8-bit floats on Hopper GPUs: half of bf16's bytes. This chapter defines the format
//! ([`e4m3`]), the per-layer scales that place each layer's values in its range ([`scales`]),
//! and a CPU runner that computes exactly what a GPU reading an FP8 cache computes
//! ([`Fp8CpuRunner`]), so that the cost in accuracy can be measured on any machine and the GPU
//! kernels tested against it.

mod attention;
pub mod e4m3;
#[cfg(feature = "exercises")]
pub mod exercises;
pub mod measure;
mod runner;
pub mod scales;

pub use attention::Fp8Attention;
pub use runner::{Fp8CpuRunner, fp8_cpu_runner};
pub use scales::KvScales;
