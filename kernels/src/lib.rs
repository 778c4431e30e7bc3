//! nano-serving's CUDA kernels and their Rust launchers.
//!
//! The kernels are CUDA C files under `src/cuda/`, embedded in the binary and compiled at run
//! time by NVRTC for the GPU that is present (see [`compile`]); building this crate needs no
//! CUDA installation, and the CUDA libraries (driver, NVRTC, cuBLAS) are loaded when a [`Gpu`]
//! is opened.
//!
//! Conventions: activations and KV are bf16 on the device, arithmetic is f32. Launchers take
//! device buffers and sizes, check the sizes on the host, queue the kernel on the [`Gpu`]'s
//! stream and return without waiting.
//!
//! | step of a layer                     | module        | idea it teaches                       |
//! |-------------------------------------|---------------|---------------------------------------|
//! | embedding, last-row pick            | [`gather`]    | coalesced 16-byte copies              |
//! | RMSNorm, residual add + RMSNorm     | [`norm`]      | block reductions, fusion              |
//! | QKV projection, MLP, lm_head        | [`linear`]    | cuBLAS GEMM, fused weights            |
//! | the same, in a decode step          | [`split_k`]   | split-K: enough tiles for thin GEMMs  |
//! | q/k norm, RoPE, KV store            | [`rope`]      | paged KV writes (vLLM)                |
//! | prefill attention                   | [`prefill`]   | FlashAttention-2 on tensor cores      |
//! | decode attention                    | [`decode`]    | bandwidth-bound paged decode, split-K |
//! | cascade and split merges            | [`merge`]     | FlashInfer's merge_state              |
//! | Qwen2's q/k/v bias                  | [`linear`]    | elementwise fusion                    |
//! | SwiGLU activation                   | [`activation`]| elementwise fusion                    |
//! | sampling                            | [`sampling`]  | radix select; a block cluster per row |
//! | a whole decode step                 | [`graph`]     | CUDA graphs: one launch per step      |

mod check;
pub mod compile;
mod device;
mod error;
mod source;
mod tma;

pub mod activation;
pub mod decode;
pub mod gather;
pub mod graph;
pub mod linear;
pub mod merge;
pub mod norm;
pub mod paged;
pub mod prefill;
pub mod random;
pub mod rope;
pub mod sampling;
pub mod split_k;

pub use compile::{Arch, Compiler};
pub use device::{Gpu, device_count};
pub use error::{Error, Result};
pub use source::Source;

pub use cudarc::driver::{
    CudaEvent, CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DriverError,
    PinnedHostSlice, ValidAsZeroBits,
};
pub use half::bf16;
