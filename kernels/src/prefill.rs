//! Prefill attention over paged KV: FlashAttention-2 (tiles, online softmax, registers-only
//! P·V) reading K/V through a page table (vLLM's PagedAttention), with GQA heads folded into
//! the tile rows as FlashInfer does. The CUDA side is `cuda/prefill_attention.cu`.
//!
//! On Hopper, head_dim 128 over a bf16 cache runs `cuda/prefill_hopper.cu` instead: the same
//! algorithm with its products on warpgroup MMAs (FlashAttention-3's route), 128 rows a block;
//! `cuda/prefill_hopper_ws.cu` is the same again with a producer warpgroup feeding the two that
//! compute (FlashAttention-3's warp specialization), by the TMA where a tile's pages are full
//! (the tensor maps of `tma.rs` are made here, at each launch). [`PrefillKernel`] names them;
//! [`prefill_attention`] picks the best the device has.
//!
//! Without the causal mask, writing the log-sum-exp, either kernel is the shared-prefix half of
//! cascade attention and attends the pieces of split-KV (see [`crate::merge`]).

use cudarc::driver::{CudaView, DevicePtrMut, LaunchConfig};
use half::bf16;

use crate::check;
use crate::device::{Gpu, arg, grid};
use crate::error::Result;
use crate::paged::{AttentionInputs, CacheRead};
use crate::source::Source;
use crate::tma;

/// Which rows of `q` belong to which sequence.
#[derive(Debug)]
pub struct PrefillQueries<'a> {
    /// `i32[num_seqs + 1]`: the queries of sequence s are rows `indptr[s]..indptr[s+1]` of the
    /// call's output; the kernels read them from q at the same rows taken modulo q's rows
    /// (the same rows, except in [`prefill_attention_pieces`], whose q holds one copy).
    pub indptr: CudaView<'a, i32>,
    /// The largest number of queries of one sequence (sizes the grid; known on the host).
    pub max_len: usize,
}

const K: &str = "prefill_attention";

/// The largest grid dimension z a launch may have (CUDA's limit for y and z).
const MAX_GRID_Z: u32 = 65_535;

/// Which prefill kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillKernel {
    /// FlashAttention-2 on `mma.sync` (sm_80+, every head size and cache type).
    Mma,
    /// The same on Hopper's warpgroup MMAs (sm_90a, head_dim 128, bf16 cache): 128 rows a
    /// block, KV tiles of 128 slots, one block a multiprocessor.
    Wgmma,
    /// [`Self::Wgmma`] with warp specialization: a third warpgroup copies K/V into a ring of
    /// stages handed over through mbarriers (tiles of full pages by the TMA), so the two that
    /// compute never wait at a block-wide barrier; persistent: one block a multiprocessor takes
    /// `Wgmma`'s blocks as work items, loading the next while it computes the last (same
    /// inputs as `Wgmma`).
    WgmmaWarpSpecialized,
}

impl PrefillKernel {
    /// The fastest kernel that runs `inputs` on `gpu`: on Hopper the warp-specialized one
    /// (1.1-1.2x [`Self::Wgmma`] on the attention bench's shapes, H100).
    pub fn best<C: CacheRead>(gpu: &Gpu, inputs: &AttentionInputs<'_, C>) -> Self {
        let fp8 = inputs.k_cache.fp8_scale().is_some();
        Self::best_for(gpu, inputs.cache.head_dim, fp8)
    }

    /// Whether a kernel launched after this one as a programmatic dependent may start before
    /// it ends, on the multiprocessors this one leaves free (the warp-specialized kernel says so
    /// as soon as its blocks have waited for the kernel before it; the others let it start only
    /// as they end). Cascade's decode rows run beside the first level's call this way
    /// ([`crate::decode::decode_attention_beside`]).
    pub fn lets_dependents_start(self) -> bool {
        self == Self::WgmmaWarpSpecialized
    }

    /// The kernel [`Self::best`] picks over a cache of `head_dim`, FP8 or not.
    pub fn best_for(gpu: &Gpu, head_dim: usize, fp8: bool) -> Self {
        if Self::WgmmaWarpSpecialized.runs_shape(gpu, head_dim, fp8) {
            Self::WgmmaWarpSpecialized
        } else {
            Self::Mma
        }
    }

    /// Whether this kernel can run `inputs` on `gpu`.
    pub fn runs<C: CacheRead>(self, gpu: &Gpu, inputs: &AttentionInputs<'_, C>) -> bool {
        let fp8 = inputs.k_cache.fp8_scale().is_some();
        self.runs_shape(gpu, inputs.cache.head_dim, fp8)
    }

    fn runs_shape(self, gpu: &Gpu, head_dim: usize, fp8: bool) -> bool {
        match self {
            Self::Mma => true,
            Self::Wgmma | Self::WgmmaWarpSpecialized => {
                gpu.arch().is_hopper() && head_dim == 128 && !fp8
            }
        }
    }

    /// (Rows (query, head) a block, blocks that fill `gpu` once): what a split of the KV into
    /// pieces aims for, one wave of blocks. The Hopper kernels hold one block a multiprocessor;
    /// for the `mma.sync` kernel, two a multiprocessor, the count its split was first fitted to.
    pub fn wave(self, gpu: &Gpu) -> (usize, usize) {
        let per_sm = match self {
            Self::Mma => 2,
            Self::Wgmma | Self::WgmmaWarpSpecialized => 1,
        };
        (self.block_rows(), per_sm * gpu.num_sms())
    }

    /// Rows (query, head) per block, as in the kernel.
    fn block_rows(self) -> usize {
        match self {
            Self::Mma => 64,
            Self::Wgmma | Self::WgmmaWarpSpecialized => 128,
        }
    }

    /// Threads a block, as in the kernel.
    fn block_threads(self) -> u32 {
        match self {
            Self::Mma => 128,
            Self::Wgmma => 256,
            Self::WgmmaWarpSpecialized => 384,
        }
    }

    /// Dynamic shared memory a block: none for the `mma.sync` kernel (its arrays are static);
    /// for the two-warpgroup Hopper kernel Q (128 rows), two stages of K and three of V (128
    /// slots, head_dim 128, bf16), three slot tables and an int a warp, plus 1 KiB to align the
    /// tiles to the swizzle's 1024 bytes. The warp-specialized kernel holds two Qs, two slot
    /// tables with their flags, two work items, the fourteen mbarriers of the stages and of the
    /// Qs and an int a producer warp: 231,632 bytes, which leave 816 of the 232,448 a block may
    /// have on an H100. Its launch adds 512 for the alignment, and the kernel traps (the launch
    /// fails and the CUDA context is lost) if its window needs more: a block's window, with no
    /// static shared memory before it, starts 1024-byte aligned on Hopper, which is what is
    /// observed and what CUTLASS's Hopper kernels rely on, not a documented promise.
    fn shared_bytes(self) -> usize {
        let tile = 128 * 128 * 2;
        let table = (2 * 128 + 1) * 4;
        let item = 7 * 4;
        match self {
            Self::Mma => 0,
            Self::Wgmma => 6 * tile + 3 * table + 8 * 4 + 1024,
            // The last 8: the next item's index, padded to the mbarriers' 8-byte alignment.
            Self::WgmmaWarpSpecialized => {
                7 * tile + 2 * (table + 4) + 2 * item + 14 * 8 + 4 * 4 + 8 + 512
            }
        }
    }
}

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
    let kernel = PrefillKernel::best(gpu, inputs);
    prefill_attention_on(gpu, kernel, inputs, queries, causal, out, lse)
}

/// The unmasked pass over the pieces of a KV cut apart (split-KV's and cascade's, merged by
/// [`crate::merge`]): each sequence of `queries` is one piece, and `inputs.q` holds exactly one
/// copy of the queries, which every piece reads: sequence `s` reads its rows from row
/// `queries.indptr[s]` mod the rows of `inputs.q`, so a piece's rows must lie in one copy (as
/// when piece `p` of a part is rows `p x rows..` of the call). Its outputs and log-sum-exp go to
/// rows `queries.indptr[s]..` of `out` and `lse`: `pieces` times the rows of `inputs.q` in all
/// (`pieces` sizes the checks; the kernel needs only the indptr). Reading the queries in place
/// spares a gather that would repeat them once per piece, a kernel the pass would wait on.
///
/// With `early` (it matters only on Hopper's warp-specialized kernel; the others are launched
/// as usual), the blocks start as the kernel before them ends: they read the page table, the
/// queries' indptr and the K/V slots of their first tiles, then wait for that kernel before
/// they read Q, take more work or write anything, and only then let a kernel after them start
/// (cascade's decode beside the pass, which reads the same queries). So no kernel that may
/// still run as the call starts may write those: the kernel before, and any it let start
/// early. In the CUDA runner that kernel is RoPE's K/V store, which writes only the step's new
/// tokens' slots, none of which a level reads; the causal prefill; a gather; or the last level's
/// merge.
pub fn prefill_attention_pieces<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    queries: &PrefillQueries<'_>,
    pieces: usize,
    early: bool,
    out: &mut impl DevicePtrMut<bf16>,
    lse: &mut dyn DevicePtrMut<f32>,
) -> Result<()> {
    let kernel = PrefillKernel::best(gpu, inputs);
    let launch = Launch { early, pieces };
    launch_prefill(gpu, kernel, launch, inputs, queries, false, out, Some(lse))
}

/// [`prefill_attention_pieces`] on a chosen kernel, launched as usual; an error if that kernel
/// cannot run `inputs`.
pub fn prefill_attention_pieces_on<C: CacheRead>(
    gpu: &Gpu,
    kernel: PrefillKernel,
    inputs: &AttentionInputs<'_, C>,
    queries: &PrefillQueries<'_>,
    pieces: usize,
    out: &mut impl DevicePtrMut<bf16>,
    lse: &mut dyn DevicePtrMut<f32>,
) -> Result<()> {
    let launch = Launch {
        early: false,
        pieces,
    };
    launch_prefill(gpu, kernel, launch, inputs, queries, false, out, Some(lse))
}

/// [`prefill_attention`] on a chosen kernel; an error if that kernel cannot run `inputs`.
pub fn prefill_attention_on<C: CacheRead>(
    gpu: &Gpu,
    kernel: PrefillKernel,
    inputs: &AttentionInputs<'_, C>,
    queries: &PrefillQueries<'_>,
    causal: bool,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<()> {
    let launch = Launch {
        early: false,
        pieces: 1,
    };
    launch_prefill(gpu, kernel, launch, inputs, queries, causal, out, lse)
}

/// How a call launches: how many copies of Q's rows its queries read
/// ([`prefill_attention_pieces`]), and whether it starts as the kernel before it ends.
#[derive(Debug, Clone, Copy)]
struct Launch {
    early: bool,
    pieces: usize,
}

/// The prefill kernel `kernel`; where `launch.early` and it is the warp-specialized kernel (the
/// one that waits for the kernel before it, before its first Q), as a programmatic dependent of
/// that kernel ([`prefill_attention_pieces`]).
#[allow(clippy::too_many_arguments)]
fn launch_prefill<C: CacheRead>(
    gpu: &Gpu,
    kernel: PrefillKernel,
    launch: Launch,
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
    if launch.pieces == 0 {
        return Err(check::invalid(K, "pieces must be at least 1"));
    }
    let out_rows = rows * launch.pieces;
    check::at_least(K, "output", out.len(), out_rows * hq * d)?;
    let lse_ptr = match lse {
        Some(l) => {
            check::at_least(K, "lse", l.len(), out_rows * hq)?;
            gpu.ptr_dyn(l)
        }
        None => 0,
    };
    if !kernel.runs(gpu, inputs) {
        return Err(check::invalid(
            K,
            "the wgmma kernels need a Hopper GPU, head_dim 128 and a bf16 cache",
        ));
    }
    let tiles = (queries.max_len * inputs.group()).div_ceil(kernel.block_rows());
    if num_seqs == 0 || tiles == 0 {
        return Ok(());
    }
    let out_ptr = gpu.ptr_mut(out);
    check::aligned(K, "output", out_ptr)?;
    let name = match (kernel, d, fp8) {
        (PrefillKernel::Wgmma, _, _) => "prefill_attention_hopper_d128",
        (PrefillKernel::WgmmaWarpSpecialized, _, _) => "prefill_attention_hopper_ws_d128",
        (_, 32, false) => "prefill_attention_d32",
        (_, 64, false) => "prefill_attention_d64",
        (_, _, false) => "prefill_attention_d128",
        (_, 32, true) => "prefill_attention_fp8_d32",
        (_, 64, true) => "prefill_attention_fp8_d64",
        (_, _, true) => "prefill_attention_fp8_d128",
    };
    let source = match kernel {
        PrefillKernel::Mma => Source::PrefillAttention,
        PrefillKernel::Wgmma => Source::PrefillHopper,
        PrefillKernel::WgmmaWarpSpecialized => Source::PrefillHopperWs,
    };
    let f = gpu.function_with(source, name, kernel.shared_bytes())?;
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
        check::int(K, "q rows", rows.max(1))?,
    ];
    let tiles = check::int(K, "query tiles", tiles)?;
    let (seqs, heads) = (num_seqs as u32, inputs.cache.num_kv_heads as u32);
    let blocks = match kernel {
        PrefillKernel::Mma => (tiles as u32, seqs, heads),
        // Heaviest tiles first (hopper_attention.cuh): the tiles are the slowest dimension.
        PrefillKernel::Wgmma => {
            if tiles as u32 > MAX_GRID_Z {
                return Err(check::invalid(
                    K,
                    "too many query rows in one sequence for the wgmma kernels' grid",
                ));
            }
            (seqs, heads, tiles as u32)
        }
        // The same blocks as work items (in the kernel's order, `ws_item`), one block a
        // multiprocessor.
        PrefillKernel::WgmmaWarpSpecialized => {
            let items = check::int(K, "work items", num_seqs * inputs.cache.num_kv_heads)?
                .checked_mul(tiles)
                .ok_or_else(|| check::invalid(K, "too many work items for one launch"))?;
            ((items as u32).min(gpu.num_sms() as u32), 1, 1)
        }
    };
    let causal = causal as i32;
    let mut args: Vec<_> = ptrs.iter().map(arg).chain(ints.iter().map(arg)).collect();
    args.extend([arg(&inputs.sm_scale), arg(&causal)]);
    // The warp-specialized kernel copies tiles that pages lay out whole with the TMA, in boxes
    // of 16 rows (the smallest page) and 64 columns. (A cache of no rows has no page to copy;
    // its map describes one row, which is never read.) It copies Q with the TMA too where a
    // work item's 128 rows are whole tokens (the group of q heads divides 128), and stores its
    // output with it where a consumer's 64 are (the group divides 64); otherwise those maps are
    // the K map, never read.
    let maps = match kernel {
        PrefillKernel::WgmmaWarpSpecialized => {
            let map = |cache: &C| {
                let rows = (cache.elements() / d).max(1);
                tma::rows_of_128(cache.address(gpu), rows, 16)
            };
            let k_map = map(&inputs.k_cache)?;
            let group = hq / inputs.cache.num_kv_heads;
            let q_tma = 128 % group == 0 && rows > 0;
            let o_tma = 64 % group == 0 && rows > 0;
            let q_map = if q_tma {
                tma::folded_rows(gpu.ptr(&inputs.q), rows, hq, group, 128)?
            } else {
                k_map
            };
            let o_map = if o_tma {
                tma::folded_rows(out_ptr, out.len() / (hq * d), hq, group, 64)?
            } else {
                k_map
            };
            let flags = (q_tma as i32, o_tma as i32);
            Some((k_map, map(&inputs.v_cache)?, q_map, o_map, flags))
        }
        _ => None,
    };
    if kernel == PrefillKernel::Mma {
        args.extend([arg(&k_scale), arg(&v_scale)]);
    }
    // The work items' first and third dimensions: sequences and the longest one's query tiles.
    let seqs_arg = check::int(K, "sequences", num_seqs)?;
    if let Some((k_map, v_map, q_map, o_map, (q_tma, o_tma))) = &maps {
        args.extend([
            arg(k_map),
            arg(v_map),
            arg(q_map),
            arg(q_tma),
            arg(o_map),
            arg(o_tma),
            arg(&seqs_arg),
            arg(&tiles),
        ]);
    }
    let config = LaunchConfig {
        shared_mem_bytes: kernel.shared_bytes() as u32,
        ..grid(blocks, kernel.block_threads())
    };
    let dependent = launch.early && kernel == PrefillKernel::WgmmaWarpSpecialized;
    unsafe { gpu.launch_args(K, &f, config, &mut args, dependent) }?;
    Ok(())
    // END SOLUTION
}
