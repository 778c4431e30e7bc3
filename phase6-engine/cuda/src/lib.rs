//! Chapter 6.4: the GPU.
//!
//! [`CudaRunner`] runs the model's forward pass on an NVIDIA GPU through the `kernels` crate,
//! with the same tokens as the CPU runner up to bf16 rounding: one plan and one upload per
//! step, decode replayed from CUDA graphs, sampling on the device. It is a [`ChunkRunner`]
//! (cascade attention and K/V copies on the device) and a [`QueuedRunner`], which is what
//! overlap scheduling ([`overlap`]) needs. It builds without a CUDA installation: the driver,
//! NVRTC and cuBLAS are loaded when a runner is made.
//!
//! [`ChunkRunner`]: phase6_chunks::ChunkRunner

pub mod forward;
mod graphs;
pub mod overlap;
mod runner;
mod staging;

pub use forward::{Activations, DeviceModel, Dims, KvCache, StepInputs};
pub use kernels::device_count;
pub use overlap::{Overlap, OverlapDriver, PENDING_TOKEN, QueuedRunner};
pub use phase6_cuda_weights::{DeviceWeights, TensorSource};
pub use runner::{CudaOptions, CudaRunner, MemoryReport};
