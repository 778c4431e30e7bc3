//! Random weights written in place on the device: a counter-based uniform draw per element,
//! bit for bit the host recipe of the model-loading chapter, so no weight crosses PCIe.

use cudarc::driver::{DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// Which elements of a stream a tensor holds: output element `i`, in row `i / width` and
/// column `i % width`, is element `first + row * stride + column`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub first: u64,
    pub width: u64,
    pub stride: u64,
}

impl Window {
    /// Elements `0..len`: a whole tensor's own stream.
    pub fn whole(len: u64) -> Self {
        Self {
            first: 0,
            width: len.max(1),
            stride: len.max(1),
        }
    }
}

/// Fills `out` with the elements `window` picks from the stream `key`, uniform in
/// `mean ± half_width` (see `random.cu` for the exact arithmetic).
pub fn fill_uniform(
    gpu: &Gpu,
    out: &mut impl DevicePtrMut<bf16>,
    key: u64,
    mean: f32,
    half_width: f32,
    window: Window,
) -> Result<()> {
    const K: &str = "fill_uniform_bf16";
    let n = out.len() as u64;
    if n == 0 {
        return Ok(());
    }
    let f = gpu.function(Source::Random, K)?;
    let blocks = n.div_ceil(256).min(gpu.num_sms() as u64 * 16) as u32;
    let po = gpu.ptr_mut(out);
    let mut launch = gpu.stream().launch_builder(&f);
    launch
        .arg(&po)
        .arg(&n)
        .arg(&key)
        .arg(&mean)
        .arg(&half_width)
        .arg(&window.first)
        .arg(&window.width)
        .arg(&window.stride);
    unsafe { launch.launch(grid((blocks, 1, 1), 256)) }.during(K)?;
    Ok(())
}
