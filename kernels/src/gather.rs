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
    launch(gpu, "embedding", ids, table, (0, vocab), out, hidden)
}

/// [`embedding`] over a slice of the vocabulary: `table: bf16[rows, hidden]` holds the rows of
/// ids `first..first + rows` (a tensor-parallel rank's part), and any other id gives a row of
/// zeros, so the ranks' outputs sum to the whole lookup.
pub fn embedding_slice(
    gpu: &Gpu,
    ids: &impl DevicePtr<u32>,
    table: &impl DevicePtr<bf16>,
    (first, rows): (usize, usize),
    out: &mut impl DevicePtrMut<bf16>,
    hidden: usize,
) -> Result<()> {
    launch(
        gpu,
        "embedding_slice",
        ids,
        table,
        (first, rows),
        out,
        hidden,
    )
}

/// Joins the vocabulary slices of tensor-parallel logits: `parts: f32[ranks, rows, each]` (what
/// an all-gather of every rank's `[rows, each]` block gives) into `out: f32[rows, vocab]`, where
/// rank `r` holds ids `r * each..` and `vocab <= ranks * each`.
pub fn join_vocab_slices(
    gpu: &Gpu,
    parts: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
    rows: usize,
    vocab: usize,
    each: usize,
) -> Result<()> {
    const K: &str = "join_vocab_slices";
    if each == 0 || rows == 0 {
        return Ok(());
    }
    let ranks = vocab.div_ceil(each);
    check::at_least(K, "parts", parts.len(), ranks * rows * each)?;
    check::at_least(K, "output", out.len(), rows * vocab)?;
    let n = rows * vocab;
    let (rows_arg, vocab_arg, each_arg) = (
        check::int(K, "rows", rows)?,
        check::int(K, "vocab", vocab)?,
        check::int(K, "each", each)?,
    );
    let (pp, po) = (gpu.ptr(parts), gpu.ptr_mut(out));
    let f = gpu.function(Source::GatherRows, K)?;
    let mut launch = gpu.stream().launch_builder(&f);
    launch
        .arg(&pp)
        .arg(&po)
        .arg(&rows_arg)
        .arg(&vocab_arg)
        .arg(&each_arg);
    let blocks =
        u32::try_from(n.div_ceil(256)).map_err(|_| check::invalid(K, "too many logits"))?;
    unsafe { launch.launch(grid((blocks, 1, 1), 256)) }.during(K)?;
    Ok(())
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
    launch(gpu, "gather_rows", index, src, (0, src_rows), out, width)
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
    (first, table_rows): (usize, usize),
    out: &mut impl DevicePtrMut<bf16>,
    width: usize,
) -> Result<()> {
    let rows = index.len();
    check::multiple_of_8(kernel, "row width", width)?;
    check::at_least(kernel, "table", table.len(), table_rows * width)?;
    check::at_least(kernel, "output", out.len(), rows * width)?;
    let (Ok(first), Ok(table_rows)) = (u32::try_from(first), u32::try_from(table_rows)) else {
        return Err(check::invalid(kernel, "more than 2^32 table rows"));
    };
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
        .arg(&first)
        .arg(&table_rows)
        .arg(&width_arg);
    unsafe { launch.launch(grid((rows as u32, 1, 1), threads)) }.during(kernel)?;
    Ok(())
}
