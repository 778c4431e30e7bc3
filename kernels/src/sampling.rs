//! Sampling on the device: one token id per row of logits comes back instead of the logits.
//!
//! Greedy rows take the argmax (lowest index on ties). Other rows follow phase2's
//! `sampler::sample` step for step (temperature, top-k and top-p as a logit threshold, a draw
//! in vocabulary order with the SplitMix64 uniform of `(seed, step)`), finding the thresholds
//! by radix selection over the logits' bits instead of sorting. From Hopper on, a row is read
//! by a cluster of blocks that merge their histograms in each other's shared memory, so that a
//! batch of 64 rows keeps every SM busy. See `cuda/sampling.cu`.

use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use half::bf16;

use crate::check;
use crate::compile::Arch;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// One row's sampling parameters, laid out as the kernel reads them (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SampleParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// <= 0 or >= vocab: off.
    pub top_k: i32,
    /// >= 1: off.
    pub top_p: f32,
    pad: u32,
    pub seed: u64,
    /// Index of the token being sampled in the request's output.
    pub step: u64,
}

// Safety: plain old data with a C layout.
unsafe impl DeviceRepr for SampleParams {}

impl SampleParams {
    pub fn new(temperature: f32, top_k: i32, top_p: f32, seed: u64, step: u64) -> Self {
        Self {
            temperature,
            top_k,
            top_p,
            pad: 0,
            seed,
            step,
        }
    }

    pub fn greedy() -> Self {
        Self::new(0.0, -1, 1.0, 0, 0)
    }
}

/// Element types the sampler reads logits in.
pub trait Logit: DeviceRepr {
    const KERNEL: &'static str;
}

impl Logit for f32 {
    const KERNEL: &'static str = "sample_f32";
}

impl Logit for bf16 {
    const KERNEL: &'static str = "sample_bf16";
}

/// Blocks per row and threads per block of the sampling kernel on `arch`: a cluster of 8 blocks
/// of 256 threads from Hopper (sm_90) on, where thread-block clusters exist; one block of 1,024
/// threads before. The kernel is compiled with the same choice (`SAMPLE_CLUSTER`,
/// `SAMPLE_THREADS` in `cuda/sampling.cu`), its cluster size fixed at compile time, so a plain
/// launch of `rows * blocks` blocks forms the clusters.
pub fn launch_shape(arch: Arch) -> (u32, u32) {
    if arch.major >= 9 { (8, 256) } else { (1, 1024) }
}

/// How many rows of `T` logits the device samples at once: the clusters (one a row) that fit
/// on it together, as the driver computes it. A batch with more rows runs in several waves.
pub fn rows_at_once<T: Logit>(gpu: &Gpu) -> Result<u32> {
    let f = gpu.function(Source::Sampling, T::KERNEL)?;
    let (blocks, threads) = launch_shape(gpu.arch());
    if blocks == 1 {
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .during("sample occupancy")?;
        return Ok(per_sm * gpu.num_sms() as u32);
    }
    f.occupancy_max_active_clusters(grid((blocks, 1, 1), threads), gpu.stream())
        .during("sample occupancy")
}

/// `logits: [rows, vocab]`, `params: SampleParams[rows]` -> `out: u32[rows]`.
pub fn sample<T: Logit>(
    gpu: &Gpu,
    logits: &impl DevicePtr<T>,
    params: &impl DevicePtr<SampleParams>,
    out: &mut impl DevicePtrMut<u32>,
    rows: usize,
    vocab: usize,
) -> Result<()> {
    const K: &str = "sample";
    if vocab == 0 {
        return Err(check::invalid(K, "empty vocabulary"));
    }
    check::at_least(K, "logits", logits.len(), rows * vocab)?;
    check::at_least(K, "params", params.len(), rows)?;
    check::at_least(K, "output", out.len(), rows)?;
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function(Source::Sampling, T::KERNEL)?;
    let (pl, pp, po) = (gpu.ptr(logits), gpu.ptr(params), gpu.ptr_mut(out));
    let vocab_arg = check::int(K, "vocab", vocab)?;
    let (blocks, threads) = launch_shape(gpu.arch());
    let blocks = check::int(K, "blocks", rows * blocks as usize)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&pl).arg(&vocab_arg).arg(&pp).arg(&po);
    unsafe { launch.launch(grid((blocks as u32, 1, 1), threads)) }.during(K)?;
    Ok(())
}
