//! SwiGLU's activation over the fused gate/up projection: `silu(gate) * up`.

use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// `gate_up: bf16[rows, 2 * inter]` holding `[gate | up]` per row (the fused GEMM's output,
/// see [`crate::linear::fuse_rows`]) -> `out: bf16[rows, inter]`.
pub fn silu_mul(
    gpu: &Gpu,
    gate_up: &impl DevicePtr<bf16>,
    out: &mut impl DevicePtrMut<bf16>,
    rows: usize,
    inter: usize,
) -> Result<()> {
    const K: &str = "silu_mul";
    check::multiple_of_8(K, "intermediate size", inter)?;
    check::at_least(K, "gate_up", gate_up.len(), rows * 2 * inter)?;
    check::at_least(K, "output", out.len(), rows * inter)?;
    if rows == 0 {
        return Ok(());
    }
    let (pi, po) = (gpu.ptr(gate_up), gpu.ptr_mut(out));
    check::aligned(K, "gate_up", pi)?;
    check::aligned(K, "output", po)?;
    let f = gpu.function(Source::SiluMul, "silu_mul")?;
    let chunks = rows * inter / 8;
    let blocks = chunks.div_ceil(256).min(gpu.num_sms() * 8) as u32;
    let (rows_arg, inter_arg) = (check::int(K, "rows", rows)?, check::int(K, "inter", inter)?);
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&pi).arg(&po).arg(&rows_arg).arg(&inter_arg);
    unsafe { launch.launch(grid((blocks, 1, 1), 256)) }.during(K)?;
    Ok(())
}
