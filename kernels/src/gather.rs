//! Row gathers: the embedding lookup, and picking the rows that feed the lm_head.
//!
//! Both are `out[i] = table[index[i]]` over bf16 rows, one block per output row moving 16-byte
//! chunks. Only the last token of each sequence that samples needs logits, so gathering those
//! rows before the lm_head GEMM shrinks it from all prompt tokens to one row per sequence.

use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// `out[t, :] = table[ids[t], :]` for `ids: u32[num_tokens]`, `table: bf16[vocab, hidden]`,
/// `out: bf16[num_tokens, hidden]`. An id >= vocab gives a row of zeros.
pub fn embedding(
    gpu: &Gpu,
    ids: &impl DevicePtr<u32>,
    table: &impl DevicePtr<bf16>,
    vocab: usize,
    out: &mut impl DevicePtrMut<bf16>,
    hidden: usize,
) -> Result<()> {
    launch(gpu, "embedding", ids, table, vocab, out, hidden)
}

/// `out[i, :] = src[index[i], :]` for `src: bf16[src_rows, width]`, `index: u32[len]`,
/// `out: bf16[index.len(), width]`. An index >= src_rows gives a row of zeros.
pub fn gather_rows(
    gpu: &Gpu,
    src: &impl DevicePtr<bf16>,
    src_rows: usize,
    index: &impl DevicePtr<u32>,
    out: &mut impl DevicePtrMut<bf16>,
    width: usize,
) -> Result<()> {
    launch(gpu, "gather_rows", index, src, src_rows, out, width)
}

/// Marks an input id as "row `row` of the previous step's sampled ids" (see [`take_pending`]).
pub const fn pending_id(row: u32) -> u32 {
    0x8000_0000 | row
}

/// Replaces every [`pending_id`] in `ids` by the token `prev` holds at that row, on the device:
/// the step decided while the one before it ran (overlap scheduling) reads the tokens that step
/// sampled without a trip through the host.
pub fn take_pending(
    gpu: &Gpu,
    ids: &mut impl DevicePtrMut<u32>,
    prev: &impl DevicePtr<u32>,
) -> Result<()> {
    const K: &str = "take_pending_ids";
    let n = check::int(K, "ids", ids.len())?;
    let prev_rows = check::int(K, "previous ids", prev.len())?;
    if n == 0 {
        return Ok(());
    }
    let (pi, pp) = (gpu.ptr_mut(ids), gpu.ptr(prev));
    let f = gpu.function(Source::GatherRows, K)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&pi).arg(&pp).arg(&n).arg(&prev_rows);
    let blocks = (n as u32).div_ceil(128);
    unsafe { launch.launch(grid((blocks, 1, 1), 128)) }.during(K)?;
    Ok(())
}

fn launch(
    gpu: &Gpu,
    kernel: &'static str,
    index: &impl DevicePtr<u32>,
    table: &impl DevicePtr<bf16>,
    table_rows: usize,
    out: &mut impl DevicePtrMut<bf16>,
    width: usize,
) -> Result<()> {
    let rows = index.len();
    check::multiple_of_8(kernel, "row width", width)?;
    check::at_least(kernel, "table", table.len(), table_rows * width)?;
    check::at_least(kernel, "output", out.len(), rows * width)?;
    let table_rows = u32::try_from(table_rows)
        .map_err(|_| check::invalid(kernel, "more than 2^32 table rows"))?;
    let width_arg = check::int(kernel, "width", width)?;
    if rows == 0 {
        return Ok(());
    }
    let (pi, pt, po) = (gpu.ptr(index), gpu.ptr(table), gpu.ptr_mut(out));
    check::aligned(kernel, "table", pt)?;
    check::aligned(kernel, "output", po)?;
    let f = gpu.function(Source::GatherRows, "gather_rows")?;
    let threads = (width / 8).next_multiple_of(32).clamp(32, 256) as u32;
    let mut launch = gpu.stream().launch_builder(&f);
    launch
        .arg(&pi)
        .arg(&pt)
        .arg(&po)
        .arg(&table_rows)
        .arg(&width_arg);
    unsafe { launch.launch(grid((rows as u32, 1, 1), threads)) }.during(kernel)?;
    Ok(())
}
