//! Sampling on the device: one token id per row of logits comes back instead of the logits.
//!
//! Greedy rows take the argmax (lowest index on ties). Other rows follow phase2's
//! `sampler::sample` step for step (temperature, top-k and top-p as a logit threshold, a draw
//! in vocabulary order with the SplitMix64 uniform of `(seed, step)`), finding the thresholds
//! by radix selection over the logits' bits instead of sorting (a small top-k in one pass: each
//! warp keeps its largest logits behind a threshold it raises as it reads; top-p in two: the
//! first guesses where the mass crosses, the second gathers there and checks). From Hopper on,
//! a row is read by a cluster of blocks that merge their histograms in each other's shared
//! memory, so that a batch of 64 rows keeps every SM busy; the cluster's size is chosen to fit
//! the batch's rows on the device at once ([`launch_shape`]). See `cuda/sampling.cu`.

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
    /// The kernel of each shape in [`SampleShape::ALL`]'s order.
    const KERNELS: [&'static str; 3];
}

impl Logit for f32 {
    const KERNELS: [&'static str; 3] =
        ["sample_f32_8x256", "sample_f32_2x512", "sample_f32_1x1024"];
}

impl Logit for bf16 {
    const KERNELS: [&'static str; 3] = [
        "sample_bf16_8x256",
        "sample_bf16_2x512",
        "sample_bf16_1x1024",
    ];
}

/// How the sampling kernel spreads a row over the device: `blocks` blocks (a thread-block
/// cluster) of `threads` threads each. Each shape is its own kernel in `cuda/sampling.cu`, its
/// cluster size fixed at compile time, so a plain launch of `rows * blocks` blocks forms the
/// clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleShape {
    pub blocks: u32,
    pub threads: u32,
}

impl SampleShape {
    /// Every shape, the shortest time a row first.
    pub const ALL: [SampleShape; 3] = [
        SampleShape {
            blocks: 8,
            threads: 256,
        },
        SampleShape {
            blocks: 2,
            threads: 512,
        },
        SampleShape {
            blocks: 1,
            threads: 1024,
        },
    ];

    /// The shapes compiled for `arch`: clusters of 8 or 2 blocks from Hopper (sm_90) on, where
    /// thread-block clusters exist; one block of 1,024 threads before.
    pub fn available(arch: Arch) -> &'static [SampleShape] {
        if arch.major >= 9 {
            &Self::ALL[..2]
        } else {
            &Self::ALL[2..]
        }
    }

    fn kernel<T: Logit>(self) -> &'static str {
        let i = Self::ALL
            .iter()
            .position(|&s| s == self)
            .expect("a listed shape");
        T::KERNELS[i]
    }
}

/// How many rows of `T` logits `shape` samples at once on the device: the clusters (one a row)
/// that fit on it together, as the driver computes it. A batch with more rows runs in waves.
pub fn rows_at_once<T: Logit>(gpu: &Gpu, shape: SampleShape) -> Result<u32> {
    gpu.clusters_at_once(
        Source::Sampling,
        shape.kernel::<T>(),
        shape.blocks,
        shape.threads,
    )
}

/// The shape for a batch of `rows`: the fastest a row among those that take every row at once,
/// else the one that takes the most. A second wave of clusters costs as much as the first, so
/// 64 rows on 8-block clusters (62 fit on an H100) take longer than on 2-block ones.
pub fn launch_shape<T: Logit>(gpu: &Gpu, rows: usize) -> Result<SampleShape> {
    let mut best = None;
    for &shape in SampleShape::available(gpu.arch()) {
        let at_once = rows_at_once::<T>(gpu, shape)? as usize;
        if rows <= at_once {
            return Ok(shape);
        }
        if best.is_none_or(|(_, most)| at_once > most) {
            best = Some((shape, at_once));
        }
    }
    Ok(best.expect("every architecture has a shape").0)
}

/// `logits: [rows, vocab]`, `params: SampleParams[rows]` -> `out: u32[rows]`, in the shape
/// [`launch_shape`] picks.
pub fn sample<T: Logit>(
    gpu: &Gpu,
    logits: &impl DevicePtr<T>,
    params: &impl DevicePtr<SampleParams>,
    out: &mut impl DevicePtrMut<u32>,
    rows: usize,
    vocab: usize,
) -> Result<()> {
    let shape = launch_shape::<T>(gpu, rows)?;
    sample_with(gpu, shape, logits, params, out, rows, vocab)
}

/// [`sample`] in a given shape (one of [`SampleShape::available`] on the device).
pub fn sample_with<T: Logit>(
    gpu: &Gpu,
    shape: SampleShape,
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
    if !SampleShape::available(gpu.arch()).contains(&shape) {
        return Err(check::invalid(
            K,
            "a shape this device's kernels are not built for",
        ));
    }
    check::at_least(K, "logits", logits.len(), rows * vocab)?;
    check::at_least(K, "params", params.len(), rows)?;
    check::at_least(K, "output", out.len(), rows)?;
    if rows == 0 {
        return Ok(());
    }
    let f = gpu.function(Source::Sampling, shape.kernel::<T>())?;
    let (pl, pp, po) = (gpu.ptr(logits), gpu.ptr(params), gpu.ptr_mut(out));
    let vocab_arg = check::int(K, "vocab", vocab)?;
    let blocks = check::int(K, "blocks", rows * shape.blocks as usize)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&pl).arg(&vocab_arg).arg(&pp).arg(&po);
    unsafe { launch.launch(grid((blocks as u32, 1, 1), shape.threads)) }.during(K)?;
    Ok(())
}
