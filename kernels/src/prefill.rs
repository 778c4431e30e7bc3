//! Prefill attention over paged KV: FlashAttention-2 (tiles, online softmax, registers-only
//! P·V) reading K/V through a page table (vLLM's PagedAttention), with GQA heads folded into
//! the tile rows as FlashInfer does. The CUDA side is `cuda/prefill_attention.cu`.
//!
//! The same kernel without the causal mask, writing the log-sum-exp, is the shared-prefix half
//! of cascade attention (see [`crate::merge`]).

use cudarc::driver::{CudaView, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::paged::{AttentionInputs, CacheRead};
use crate::source::Source;

/// Which rows of `q` belong to which sequence.
#[derive(Debug)]
pub struct PrefillQueries<'a> {
    /// `i32[num_seqs + 1]`: the queries of sequence s are rows `indptr[s]..indptr[s+1]` of q.
    pub indptr: CudaView<'a, i32>,
    /// The largest number of queries of one sequence (sizes the grid; known on the host).
    pub max_len: usize,
}

const K: &str = "prefill_attention";
/// Rows (query, head) per block, as in the kernel.
const BLOCK_ROWS: usize = 64;

/// Attention of every query row over its sequence's KV. With `causal`, the queries of a
/// sequence are its last tokens and each sees the KV up to its own position (the new tokens'
/// K/V must already be in the cache); without, every query sees all of the KV.
/// `out: bf16[rows, num_q_heads, head_dim]`; `lse: f32[rows, num_q_heads]` (natural log) if
/// given.
pub fn prefill_attention<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    queries: &PrefillQueries<'_>,
    causal: bool,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<()> {
    // BEGIN SOLUTION
    let shift = inputs.check(K, gpu)?;
    let (k_scale, v_scale, fp8) = inputs.scales(K)?;
    let (hq, d) = (inputs.num_q_heads, inputs.cache.head_dim);
    let rows = inputs.q.len() / (hq * d);
    let num_seqs = inputs.table.num_seqs();
    if queries.indptr.len() != num_seqs + 1 {
        return Err(check::invalid(
            K,
            "queries.indptr must have one entry more than the page table has sequences",
        ));
    }
    check::at_least(K, "output", out.len(), rows * hq * d)?;
    let lse_ptr = match lse {
        Some(l) => {
            check::at_least(K, "lse", l.len(), rows * hq)?;
            gpu.ptr_dyn(l)
        }
        None => 0,
    };
    let tiles = (queries.max_len * inputs.group()).div_ceil(BLOCK_ROWS);
    if num_seqs == 0 || tiles == 0 {
        return Ok(());
    }
    let out_ptr = gpu.ptr_mut(out);
    check::aligned(K, "output", out_ptr)?;
    let name = match (d, fp8) {
        (32, false) => "prefill_attention_d32",
        (64, false) => "prefill_attention_d64",
        (_, false) => "prefill_attention_d128",
        (32, true) => "prefill_attention_fp8_d32",
        (64, true) => "prefill_attention_fp8_d64",
        (_, true) => "prefill_attention_fp8_d128",
    };
    let f = gpu.function(Source::PrefillAttention, name)?;
    let ptrs = [
        gpu.ptr(&inputs.q),
        inputs.k_cache.address(gpu),
        inputs.v_cache.address(gpu),
        gpu.ptr(&queries.indptr),
        gpu.ptr(&inputs.table.indptr),
        gpu.ptr(&inputs.table.page_ids),
        gpu.ptr(&inputs.table.page_lens),
        out_ptr,
        lse_ptr,
    ];
    let ints = [
        check::int(K, "num_q_heads", hq)?,
        check::int(K, "num_kv_heads", inputs.cache.num_kv_heads)?,
        check::int(K, "page_size", inputs.cache.page_size)?,
        shift,
        check::int(K, "num_pages", inputs.cache.num_pages)?,
    ];
    let causal = causal as i32;
    let mut launch = gpu.stream().launch_builder(&f);
    for p in &ptrs {
        launch.arg(p);
    }
    for i in &ints {
        launch.arg(i);
    }
    launch
        .arg(&inputs.sm_scale)
        .arg(&causal)
        .arg(&k_scale)
        .arg(&v_scale);
    let blocks = (
        check::int(K, "query tiles", tiles)? as u32,
        num_seqs as u32,
        inputs.cache.num_kv_heads as u32,
    );
    unsafe { launch.launch(grid(blocks, 128)) }.during(K)?;
    Ok(())
    // END SOLUTION
}
