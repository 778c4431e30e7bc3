//! RMSNorm, and the residual add fused into it.
//!
//! A decoder layer normalises twice; before each norm the previous sub-layer's output is added
//! to the residual stream. Doing the add inside the norm kernel reads and writes the hidden
//! states once instead of twice.

use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// `out = x / sqrt(mean(x^2) + eps) * weight`, row by row; `x, out: bf16[rows, hidden]`,
/// `weight: bf16[hidden]`.
pub fn rms_norm(
    gpu: &Gpu,
    x: &impl DevicePtr<bf16>,
    weight: &impl DevicePtr<bf16>,
    out: &mut impl DevicePtrMut<bf16>,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    const K: &str = "rms_norm";
    check::multiple_of_8(K, "hidden", hidden)?;
    check::at_least(K, "x", x.len(), rows * hidden)?;
    check::at_least(K, "weight", weight.len(), hidden)?;
    check::at_least(K, "output", out.len(), rows * hidden)?;
    if rows == 0 {
        return Ok(());
    }
    let (px, pw, po) = (gpu.ptr(x), gpu.ptr(weight), gpu.ptr_mut(out));
    for (what, p) in [("x", px), ("weight", pw), ("output", po)] {
        check::aligned(K, what, p)?;
    }
    let f = gpu.function(Source::RmsNorm, "rms_norm")?;
    let hidden_arg = check::int(K, "hidden", hidden)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&px).arg(&pw).arg(&po).arg(&hidden_arg).arg(&eps);
    unsafe { launch.launch(grid((rows as u32, 1, 1), threads(hidden))) }.during(K)?;
    Ok(())
}

/// `residual += x; x = rms_norm(residual) * weight`, both in place; `x, residual:
/// bf16[rows, hidden]`. The sum is rounded to bf16 when stored, and normalised as stored.
pub fn add_rms_norm(
    gpu: &Gpu,
    x: &mut impl DevicePtrMut<bf16>,
    residual: &mut impl DevicePtrMut<bf16>,
    weight: &impl DevicePtr<bf16>,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    const K: &str = "add_rms_norm";
    check::multiple_of_8(K, "hidden", hidden)?;
    check::at_least(K, "x", x.len(), rows * hidden)?;
    check::at_least(K, "residual", residual.len(), rows * hidden)?;
    check::at_least(K, "weight", weight.len(), hidden)?;
    if rows == 0 {
        return Ok(());
    }
    let (px, pr, pw) = (gpu.ptr_mut(x), gpu.ptr_mut(residual), gpu.ptr(weight));
    for (what, p) in [("x", px), ("residual", pr), ("weight", pw)] {
        check::aligned(K, what, p)?;
    }
    let f = gpu.function(Source::RmsNorm, "add_rms_norm")?;
    let hidden_arg = check::int(K, "hidden", hidden)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&px).arg(&pr).arg(&pw).arg(&hidden_arg).arg(&eps);
    unsafe { launch.launch(grid((rows as u32, 1, 1), threads(hidden))) }.during(K)?;
    Ok(())
}

/// [`add_rms_norm`] with x given as a split-K product's f32 partials (`partials: f32[splits,
/// rows, hidden]`, see [`crate::split_k`]), summed as they are read; x is written, not read.
#[allow(clippy::too_many_arguments)]
pub fn add_split_rms_norm(
    gpu: &Gpu,
    partials: &impl DevicePtr<f32>,
    splits: usize,
    x: &mut impl DevicePtrMut<bf16>,
    residual: &mut impl DevicePtrMut<bf16>,
    weight: &impl DevicePtr<bf16>,
    rows: usize,
    hidden: usize,
    eps: f32,
) -> Result<()> {
    const K: &str = "add_split_rms_norm";
    check::multiple_of_8(K, "hidden", hidden)?;
    let stride = crate::split_k::check_partials(K, partials.len(), rows, hidden, splits)?;
    check::at_least(K, "x", x.len(), rows * hidden)?;
    check::at_least(K, "residual", residual.len(), rows * hidden)?;
    check::at_least(K, "weight", weight.len(), hidden)?;
    if rows == 0 {
        return Ok(());
    }
    let (pp, px, pr, pw) = (
        gpu.ptr(partials),
        gpu.ptr_mut(x),
        gpu.ptr_mut(residual),
        gpu.ptr(weight),
    );
    for (what, p) in [
        ("partials", pp),
        ("x", px),
        ("residual", pr),
        ("weight", pw),
    ] {
        check::aligned(K, what, p)?;
    }
    let f = gpu.function(Source::RmsNorm, "add_split_rms_norm")?;
    let hidden_arg = check::int(K, "hidden", hidden)?;
    let (splits_arg, stride_arg) = (splits as i32, stride as i64);
    let mut launch = gpu.stream().launch_builder(&f);
    launch
        .arg(&pp)
        .arg(&splits_arg)
        .arg(&stride_arg)
        .arg(&px)
        .arg(&pr)
        .arg(&pw)
        .arg(&hidden_arg)
        .arg(&eps);
    unsafe { launch.launch(grid((rows as u32, 1, 1), threads(hidden))) }.during(K)?;
    Ok(())
}

/// One thread per 16-byte chunk of the row, in whole warps, at most 1024.
fn threads(hidden: usize) -> u32 {
    (hidden / 8).next_multiple_of(32).clamp(32, 1024) as u32
}
