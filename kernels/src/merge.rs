//! Merging attention over parts of the KV by log-sum-exp (FlashInfer's `merge_state`).
//!
//! Cascade attention computes, for a group of requests sharing a prefix, the attention of all
//! their queries over the shared pages in one pass (no causal mask: every query comes after
//! the prefix), then each request's attention over its own pages, and merges the two partial
//! states per (query, head). The decode kernel puts a sequence shared between blocks back together the same way.
//!
//! Split-KV attention (FlashDecoding's idea, for a few queries over a long KV): the KV is cut
//! into pieces attended at once, each piece by its own blocks, and [`merge_pieces_into`] folds
//! every piece's state into the destination rows in one launch.

use cudarc::driver::{CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, arg, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// A partial attention result: `o: bf16[rows, head_dim]` normalised over its part of the KV,
/// `lse: f32[rows]` the natural-log sum of exp(scores) over that part (`-inf` when empty).
/// A row is one (query, head).
#[derive(Debug)]
pub struct PartialState<'a> {
    pub o: CudaView<'a, bf16>,
    pub lse: CudaView<'a, f32>,
}

/// `out` (and `lse_out` if given) = the merge of `a` and `b`, for `rows` rows of `head_dim`.
pub fn merge_state(
    gpu: &Gpu,
    a: &PartialState<'_>,
    b: &PartialState<'_>,
    out: &mut impl DevicePtrMut<bf16>,
    lse_out: Option<&mut dyn DevicePtrMut<f32>>,
    rows: usize,
    head_dim: usize,
) -> Result<()> {
    const K: &str = "merge_state";
    check::head_dim(K, head_dim)?;
    for (what, state) in [("a", a), ("b", b)] {
        check::at_least(K, what, state.o.len(), rows * head_dim)?;
        check::at_least(K, what, state.lse.len(), rows)?;
        check::aligned(K, what, gpu.ptr(&state.o))?;
    }
    check::at_least(K, "output", out.len(), rows * head_dim)?;
    let lse_ptr = match lse_out {
        Some(l) => {
            check::at_least(K, "lse_out", l.len(), rows)?;
            gpu.ptr_dyn(l)
        }
        None => 0,
    };
    if rows == 0 {
        return Ok(());
    }
    let out_ptr = gpu.ptr_mut(out);
    check::aligned(K, "output", out_ptr)?;
    let f = gpu.function(Source::Merge, "merge_state")?;
    let ptrs = [
        gpu.ptr(&a.o),
        gpu.ptr(&a.lse),
        gpu.ptr(&b.o),
        gpu.ptr(&b.lse),
        out_ptr,
        lse_ptr,
    ];
    let (rows_arg, d_arg) = (check::int(K, "rows", rows)?, head_dim as i32);
    let mut launch = gpu.stream().launch_builder(&f);
    for p in &ptrs {
        launch.arg(p);
    }
    launch.arg(&rows_arg).arg(&d_arg);
    let threads = rows * head_dim / 8;
    unsafe { launch.launch(grid((threads.div_ceil(256) as u32, 1, 1), 256)) }.during(K)?;
    Ok(())
}

/// Folds `pieces` partial states computed for gathered query rows back into the main state, in
/// place: gathered row `i` is token `index[i]`, so `(o, lse)[index[i], h]` becomes the merge of
/// itself and every piece's row `(i, h)`. This is cascade attention when the queries that share
/// a segment are not contiguous in the batch (gather them with [`crate::gather::gather_rows`],
/// attend the shared pages once, merge the result back), and split-KV when that segment was
/// attended in pieces. `o: bf16[out_rows, heads, head_dim]`, `lse: f32[out_rows, heads]`;
/// `parts` holds the pieces one after the other, each `[index.len(), heads, head_dim]` (and
/// `[index.len(), heads]` of lse), as one prefill call over a table of one sequence per piece
/// writes them. Indices must be distinct (an index >= `out_rows` is skipped). Every piece is
/// weighed at once and the sum kept in f32, one launch whatever the count (a tree of
/// [`merge_state`] calls took log2(pieces) + 1 launches and rounded to bf16 at each level). An
/// empty piece (lse `-inf`) weighs nothing. On Hopper it starts while the kernel queued before
/// it ends and reads `index` before waiting for it: `index` must not be written by that kernel.
#[allow(clippy::too_many_arguments)]
pub fn merge_pieces_into(
    gpu: &Gpu,
    o: &mut impl DevicePtrMut<bf16>,
    lse: &mut impl DevicePtrMut<f32>,
    parts: &PartialState<'_>,
    pieces: usize,
    index: &impl DevicePtr<u32>,
    heads: usize,
    head_dim: usize,
) -> Result<()> {
    const K: &str = "merge_pieces_into";
    check::head_dim(K, head_dim)?;
    let rows = index.len();
    check::at_least(
        K,
        "parts.o",
        parts.o.len(),
        pieces * rows * heads * head_dim,
    )?;
    check::at_least(K, "parts.lse", parts.lse.len(), pieces * rows * heads)?;
    let out_rows = o.len() / (heads * head_dim).max(1);
    check::at_least(K, "lse", lse.len(), out_rows * heads)?;
    if rows == 0 || heads == 0 || pieces == 0 {
        return Ok(());
    }
    let (po, pl) = (gpu.ptr_mut(o), gpu.ptr_mut(lse));
    check::aligned(K, "o", po)?;
    check::aligned(K, "parts.o", gpu.ptr(&parts.o))?;
    let f = gpu.function(Source::Merge, K)?;
    let ptrs = [
        po,
        pl,
        gpu.ptr(&parts.o),
        gpu.ptr(&parts.lse),
        gpu.ptr(index),
    ];
    let ints = [
        check::int(K, "rows", rows)?,
        check::int(K, "out_rows", out_rows)?,
        check::int(K, "heads", heads)?,
        head_dim as i32,
        check::int(K, "pieces", pieces)?,
    ];
    // A programmatic dependent launch: its blocks may start while the kernel before it ends
    // (they wait for it before touching the states), which hides part of the launch.
    let mut args: Vec<_> = ptrs.iter().map(arg).chain(ints.iter().map(arg)).collect();
    let threads = rows * heads * head_dim / 8;
    let config = grid((threads.div_ceil(256) as u32, 1, 1), 256);
    unsafe { gpu.launch_args(K, &f, config, &mut args, true) }
}
