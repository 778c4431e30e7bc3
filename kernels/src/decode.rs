//! Decode attention over paged KV: one query token per sequence, bound by memory bandwidth.
//!
//! Each block reads one KV head's pages once for all the q heads of its GQA group, in 16-byte
//! loads with several in flight per lane (vLLM's paged attention, FlashInfer's decode). When
//! the batch is small, the KV of a sequence is split over several blocks (FlashDecoding's
//! split-K) whose partial results are merged by log-sum-exp. The CUDA side is
//! `cuda/decode_attention.cu`.

use cudarc::driver::{CudaSlice, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::merge::merge_splits;
use crate::paged::AttentionInputs;
use crate::source::Source;

const K: &str = "decode_attention";

/// f32 scratch for split-K partial results, allocated once and reused every step.
#[derive(Debug)]
pub struct DecodeWorkspace {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
}

impl DecodeWorkspace {
    /// Room for `max_rows` (sequence, q head) rows split `max_splits` ways.
    pub fn new(gpu: &Gpu, max_rows: usize, max_splits: usize, head_dim: usize) -> Result<Self> {
        Ok(Self {
            o: gpu.zeros(max_rows * max_splits * head_dim)?,
            lse: gpu.zeros(max_rows * max_splits)?,
        })
    }
}

/// The most KV splits a decode call takes: the merge gives each split a lane of a warp.
pub const MAX_SPLITS: usize = 32;

/// How many ways to split each sequence's KV so that the GPU has enough blocks to stay busy:
/// about 32 blocks per multiprocessor, each split at least 256 tokens long, at most 32.
///
/// Five blocks fit on a multiprocessor at once, so this is several waves: in a serving batch
/// sequence lengths differ by 10x or more, and with one block per (sequence, head group) the
/// longest sequences finish alone while most of the GPU idles. Several shorter blocks per
/// sequence let the block scheduler even the work out (on an H100, a batch of 128 sequences of
/// 100-2,047 tokens reads K/V at 2.33 TB/s unsplit and 2.58 TB/s in 4 splits).
pub fn num_splits(
    gpu: &Gpu,
    num_seqs: usize,
    num_q_heads: usize,
    num_kv_heads: usize,
    max_kv_len: usize,
) -> usize {
    let group = (num_q_heads / num_kv_heads.max(1)).max(1);
    let blocks = (num_seqs * num_q_heads / heads_per_block(group)).max(1);
    let wanted = (32 * gpu.num_sms()).div_ceil(blocks);
    wanted.min(max_kv_len / 256).clamp(1, MAX_SPLITS)
}

/// The q heads one block serves: the largest of 8, 4, 2, 1 that divides the group.
fn heads_per_block(group: usize) -> usize {
    [8, 4, 2, 1]
        .into_iter()
        .find(|g| group.is_multiple_of(*g))
        .expect("1 divides everything")
}

/// `q: bf16[num_seqs, num_q_heads, head_dim]` (one token per sequence of the page table)
/// attends to all of its sequence's KV. `out: bf16[num_seqs, num_q_heads, head_dim]`, `lse:
/// f32[num_seqs, num_q_heads]` if given. `splits > 1` needs a workspace of at least
/// `num_seqs * num_q_heads` rows and `splits` splits.
pub fn decode_attention(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_>,
    splits: usize,
    workspace: Option<&mut DecodeWorkspace>,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<()> {
    // BEGIN SOLUTION
    let shift = inputs.check(K, gpu)?;
    let (hq, d) = (inputs.num_q_heads, inputs.cache.head_dim);
    let num_seqs = inputs.table.num_seqs();
    let rows = num_seqs * hq;
    check::at_least(K, "q", inputs.q.len(), rows * d)?;
    check::at_least(K, "output", out.len(), rows * d)?;
    if splits == 0 || splits > MAX_SPLITS {
        return Err(check::invalid(
            K,
            format!("{splits} splits (1 to {MAX_SPLITS})"),
        ));
    }
    let lse_ptr = match lse {
        Some(l) => {
            check::at_least(K, "lse", l.len(), rows)?;
            gpu.ptr_dyn(l)
        }
        None => 0,
    };
    if num_seqs == 0 {
        return Ok(());
    }
    if num_seqs > i32::MAX as usize || hq > 65535 {
        return Err(check::invalid(K, "grid too large"));
    }
    let out_ptr = gpu.ptr_mut(out);
    check::aligned(K, "output", out_ptr)?;
    let (part_o, part_lse) = match (splits, workspace) {
        (1, _) => (0, 0),
        (_, Some(ws)) => {
            check::at_least(K, "workspace", ws.lse.len(), rows * splits)?;
            check::at_least(K, "workspace", ws.o.len(), rows * splits * d)?;
            (gpu.ptr_mut(&mut ws.o), gpu.ptr_mut(&mut ws.lse))
        }
        (_, None) => {
            return Err(check::invalid(K, "splits > 1 needs a DecodeWorkspace"));
        }
    };
    let gh = heads_per_block(inputs.group());
    let f = gpu.function(Source::DecodeAttention, kernel_name(d, gh))?;
    let ptrs = [
        gpu.ptr(&inputs.q),
        gpu.ptr(&inputs.k_cache),
        gpu.ptr(&inputs.v_cache),
        gpu.ptr(&inputs.table.indptr),
        gpu.ptr(&inputs.table.page_ids),
        gpu.ptr(&inputs.table.page_lens),
        out_ptr,
        lse_ptr,
        part_o,
        part_lse,
    ];
    let ints = [
        hq as i32,
        check::int(K, "num_kv_heads", inputs.cache.num_kv_heads)?,
        check::int(K, "page_size", inputs.cache.page_size)?,
        shift,
        check::int(K, "num_pages", inputs.cache.num_pages)?,
    ];
    let splits_arg = splits as i32;
    let mut launch = gpu.stream().launch_builder(&f);
    for p in &ptrs {
        launch.arg(p);
    }
    for i in &ints {
        launch.arg(i);
    }
    launch.arg(&inputs.sm_scale).arg(&splits_arg);
    let blocks = (num_seqs as u32, (hq / gh) as u32, splits as u32);
    unsafe { launch.launch(grid(blocks, 128)) }.during(K)?;
    if splits > 1 {
        merge_splits(gpu, (part_o, part_lse), (out_ptr, lse_ptr), rows, d, splits)?;
    }
    Ok(())
    // END SOLUTION
}

fn kernel_name(d: usize, gh: usize) -> &'static str {
    match (d, gh) {
        (32, 1) => "decode_attention_d32_g1",
        (32, 2) => "decode_attention_d32_g2",
        (32, 4) => "decode_attention_d32_g4",
        (32, _) => "decode_attention_d32_g8",
        (64, 1) => "decode_attention_d64_g1",
        (64, 2) => "decode_attention_d64_g2",
        (64, 4) => "decode_attention_d64_g4",
        (64, _) => "decode_attention_d64_g8",
        (_, 1) => "decode_attention_d128_g1",
        (_, 2) => "decode_attention_d128_g2",
        (_, 4) => "decode_attention_d128_g4",
        _ => "decode_attention_d128_g8",
    }
}
