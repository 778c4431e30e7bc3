//! Decode attention over paged KV: one query token per sequence, bound by memory bandwidth.
//!
//! Each block reads one KV head's pages once for all the q heads of its GQA group, in 16-byte
//! loads with several in flight per lane (vLLM's paged attention, FlashInfer's decode). The
//! grid is as many blocks as the GPU holds at once, and the batch's KV is shared out among them
//! in equal ranges whatever the sequences' lengths; a sequence cut between blocks is put back
//! together from partial results by log-sum-exp (FlashDecoding's split-K). On Hopper, at
//! head_dim 128, a producer warp's bulk copies feed the K/V through a ring of shared-memory
//! stages instead ([`DecodeKernel::BulkCopies`]). The CUDA side is `cuda/decode_attention.cu`.

use cudarc::driver::{CudaSlice, DevicePtrMut};
use half::bf16;

use crate::check;
use crate::device::{Gpu, arg, grid};
use crate::error::{DriverContext, Result};
use crate::merge::PartialState;
use crate::paged::{AttentionInputs, CacheRead, SLOT_ALIGN};
use crate::source::Source;

const K: &str = "decode_attention";

/// How a decode kernel gets its K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeKernel {
    /// Every lane loads its own 16-byte chunks into registers, several in flight (any GPU,
    /// any head_dim): four warps a block.
    Loads,
    /// Hopper, head_dim 128: a producer warp copies each page piece with one bulk copy into a
    /// ring of shared-memory stages, which four warps read; the loads in flight no longer wait
    /// for the warps' arithmetic. The faster one over an FP8 cache at one or two q heads a
    /// block (on an H100, two heads: 1-5% less time a call than the per-lane kernel on uniform
    /// batches and on 16 and 256 serving sequences, 3% more at 64); over bf16 0.4-1.2% less
    /// time at 128-256 serving sequences and 2-9% more at 16-64 (BENCHMARKS' final build).
    BulkCopies,
}

/// The bulk-copy kernel's ring of stages, in bytes: `BULK_RING_BYTES` of
/// `cuda/decode_attention.cu`, which also sets its 160 threads (four warps and a producer).
const BULK_RING_BYTES: usize = 32 * 1024;

impl DecodeKernel {
    /// The faster kernel that runs on `gpu` at `head_dim` and GQA group size `group` over a
    /// cache of FP8 codes (`fp8`) or of bf16. The bulk-copy kernel's four warps hold a block's
    /// q heads' state in registers besides the ring: past two heads a block it fits half the
    /// blocks an SM of the per-lane kernel and is no faster.
    pub fn best(gpu: &Gpu, head_dim: usize, group: usize, fp8: bool) -> Self {
        let few_heads = heads_per_block(group) <= 2;
        if fp8 && few_heads && DecodeKernel::BulkCopies.runs_on(gpu, head_dim) {
            DecodeKernel::BulkCopies
        } else {
            DecodeKernel::Loads
        }
    }

    /// Whether this kernel runs on `gpu` at `head_dim`.
    pub fn runs_on(self, gpu: &Gpu, head_dim: usize) -> bool {
        match self {
            DecodeKernel::Loads => true,
            DecodeKernel::BulkCopies => gpu.arch().is_hopper() && head_dim == 128,
        }
    }

    fn threads(self) -> u32 {
        match self {
            DecodeKernel::Loads => 128,
            DecodeKernel::BulkCopies => 160,
        }
    }

    /// Dynamic shared memory a block: the ring's K and V rows.
    fn shared_bytes(self) -> usize {
        match self {
            DecodeKernel::Loads => 0,
            DecodeKernel::BulkCopies => BULK_RING_BYTES,
        }
    }
}

/// The most blocks of either kernel a multiprocessor can hold (2,048 threads, 128 a block at
/// the least).
const MAX_BLOCKS_PER_SM: usize = 16;

/// The most q heads one block serves (its partial results are sized for this many).
const MAX_HEADS_PER_BLOCK: usize = 8;

/// The shortest range of KV slots a block takes: below this, a small batch is spread over
/// fewer blocks rather than into pieces too small to pay for their start and merge. Two
/// units of 32 slots: at 256, 64 sequences of 64 tokens (cascade's own pages) landed on 128
/// blocks of four segments each, walked one after the other (25 us on an H100 for 16.8 MB;
/// the cascade bench's split at 64 x 4k 49 -> 38 us with 64), and one sequence of ~1,000
/// tokens took 17 us against 10. Batches of more KV than a wave of 256-slot ranges are cut
/// the same either way.
pub const MIN_RANGE: usize = 64;

/// f32 scratch for the partial results of the blocks that share a sequence: two pieces a
/// block (the one its range starts with and the one it ends with). Allocated once.
#[derive(Debug)]
pub struct DecodeWorkspace {
    o: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    blocks: usize,
    /// The grid of the last call that launched, by its kernel: asking the driver for occupancy
    /// every call would cost the host a few microseconds a layer.
    grid: Option<(GridKey, usize)>,
}

/// A decode kernel: which, at head_dim, GQA group, FP8 cache, folding.
type GridKey = (DecodeKernel, usize, usize, bool, bool);

impl DecodeWorkspace {
    /// Room for as many blocks as the GPU can hold at once, at `head_dim` up to 128.
    pub fn new(gpu: &Gpu, head_dim: usize) -> Result<Self> {
        let blocks = gpu.num_sms() * MAX_BLOCKS_PER_SM;
        let pieces = 2 * blocks * MAX_HEADS_PER_BLOCK;
        Ok(Self {
            o: gpu.zeros(pieces * head_dim)?,
            lse: gpu.zeros(pieces)?,
            blocks,
            grid: None,
        })
    }

    /// Device memory it holds.
    pub fn bytes(&self) -> usize {
        4 * (self.o.len() + self.lse.len())
    }
}

/// `q: bf16[num_seqs, num_q_heads, head_dim]` (one token per sequence of the page table)
/// attends to all of its sequence's KV. `out: bf16[num_seqs, num_q_heads, head_dim]`, `lse:
/// f32[num_seqs, num_q_heads]` if given. The page table must carry its `slot_indptr`. Runs
/// the fastest kernel for the GPU ([`DecodeKernel::best`]).
pub fn decode_attention<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    workspace: &mut DecodeWorkspace,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<()> {
    let kernel = best_kernel(gpu, inputs)?;
    decode_attention_on(kernel, gpu, inputs, workspace, out, lse)
}

/// [`DecodeKernel::best`] for `inputs`' cache.
fn best_kernel<C: CacheRead>(gpu: &Gpu, inputs: &AttentionInputs<'_, C>) -> Result<DecodeKernel> {
    let fp8 = inputs.scales(K)?.2;
    Ok(DecodeKernel::best(
        gpu,
        inputs.cache.head_dim,
        inputs.group(),
        fp8,
    ))
}

/// [`decode_attention`] started beside the kernel queued before it: on Hopper its blocks may
/// start while that kernel runs, on the multiprocessors it leaves free, once it lets them
/// ([`crate::prefill::PrefillKernel::lets_dependents_start`]); the call ends after that kernel
/// does. Cascade attention runs its requests' own pages this way beside the shared prefix's
/// pass, which at 64 requests fills half the GPU. The two must not touch the same memory: the
/// decode may read nothing that kernel writes, and write nothing it reads or writes. Before
/// Hopper, or after a kernel that lets it start only as it ends, it runs after that kernel.
///
/// `slot_indptr` is the host's copy of the table's `slot_indptr`: with it the call launches
/// the merge of the blocks' pieces only where some sequence's slots are shared by two blocks,
/// or a sequence has none (cascade's own pages of 64 tokens at 64 or 128 requests: neither),
/// since that launch stands between the prefix's pass and the merge of its parts. The
/// decision is taken on the host at the call, so a call recorded into a CUDA graph, replayed
/// over other lengths, must not come through here.
pub fn decode_attention_beside<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    workspace: &mut DecodeWorkspace,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
    slot_indptr: &[i32],
) -> Result<()> {
    let kernel = best_kernel(gpu, inputs)?;
    let launch = Launch::Beside { slot_indptr };
    launch_decode(kernel, launch, gpu, inputs, workspace, out, lse).map(|_| ())
}

/// [`decode_attention_beside`] for the rows of a cascade level whose pass over the shared pages
/// is the kernel queued before it: the decode also folds the `pieces` parts that pass wrote
/// (`parts`, each `[num_seqs, num_q_heads]` rows in the table's order) into every row it
/// writes, so that no merge launch waits after it. At 64 requests of a 32k-token prefix cut
/// into 16 parts most of the decode's blocks run after the pass, and the merge after them took
/// 4-7 us more; folded, the split cascade took 62-63 us instead of 70 on an H100 (the log's
/// "The parts folded into the decode"). A block that ends its own pages before the pass does
/// waits for it, holding its place on the GPU: where the pass leaves room for most of the
/// decode beside it (a level cut for half the wave), folding is slower. Only
/// the per-lane kernel folds ([`DecodeKernel::Loads`]), where it is the fastest decode (not
/// Hopper's FP8 decode through bulk copies), and only where every block writes its segments
/// whole (none cut between two blocks, none empty, [`folds`]): elsewhere it launches nothing
/// and returns `false`; the caller then decodes beside the pass and merges as before (the
/// cascade bench does; the engine's plan asks for a fold only where [`folds`] says it will
/// happen, so a refusal is an error there). `lse`
/// then holds the merge over the row's whole KV, as after [`crate::merge::merge_pieces_into`].
#[allow(clippy::too_many_arguments)]
pub fn decode_attention_folding<C: CacheRead>(
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    workspace: &mut DecodeWorkspace,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
    slot_indptr: &[i32],
    parts: &PartialState<'_>,
    pieces: usize,
) -> Result<bool> {
    if best_kernel(gpu, inputs)? != DecodeKernel::Loads {
        return Ok(false);
    }
    let launch = Launch::Folding {
        slot_indptr,
        parts,
        pieces,
    };
    launch_decode(
        DecodeKernel::Loads,
        launch,
        gpu,
        inputs,
        workspace,
        out,
        lse,
    )
}

/// The grid of [`decode_attention_folding`] at `head_dim` and GQA group size `group`, over an
/// FP8 cache or not; `None` where it never folds (the fastest decode there is not the per-lane
/// kernel). With it [`folds`] tells a planner, before the call, whether the call will fold.
pub fn folding_blocks(
    gpu: &Gpu,
    head_dim: usize,
    group: usize,
    fp8: bool,
) -> Result<Option<usize>> {
    if DecodeKernel::best(gpu, head_dim, group, fp8) != DecodeKernel::Loads {
        return Ok(None);
    }
    let blocks = kernel_blocks(gpu, DecodeKernel::Loads, head_dim, group, fp8, true)?;
    Ok(Some(blocks))
}

/// Whether [`decode_attention_folding`] folds over a table of these `slot_indptr` prefix sums
/// (`num_q_heads` heads in GQA groups of `group`) on a grid of `blocks` ([`folding_blocks`]):
/// where no sequence's slots are shared by two blocks and none is empty.
pub fn folds(slot_indptr: &[i32], num_q_heads: usize, group: usize, blocks: usize) -> bool {
    let valid = (slot_indptr.len().checked_sub(1))
        .is_some_and(|num_seqs| check_host_slots(slot_indptr, num_seqs).is_ok());
    valid && !merge_has_work(slot_indptr, num_q_heads / heads_per_block(group), blocks)
}

/// [`decode_attention`] on the kernel given (to compare them).
pub fn decode_attention_on<C: CacheRead>(
    kernel: DecodeKernel,
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    workspace: &mut DecodeWorkspace,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<()> {
    launch_decode(kernel, Launch::Alone, gpu, inputs, workspace, out, lse).map(|_| ())
}

/// How a decode call is launched: after the kernel before it, beside it (the host's copy of
/// `slot_indptr` given), or beside a cascade level's pass folding in its parts.
#[derive(Clone, Copy)]
enum Launch<'a> {
    Alone,
    Beside {
        slot_indptr: &'a [i32],
    },
    Folding {
        slot_indptr: &'a [i32],
        parts: &'a PartialState<'a>,
        pieces: usize,
    },
}

impl<'a> Launch<'a> {
    fn host_slots(self) -> Option<&'a [i32]> {
        match self {
            Launch::Alone => None,
            Launch::Beside { slot_indptr } | Launch::Folding { slot_indptr, .. } => {
                Some(slot_indptr)
            }
        }
    }

    fn folding(self) -> bool {
        matches!(self, Launch::Folding { .. })
    }
}

/// The decode kernel on `kernel` and its merge; beside the kernel before it, the merge launched
/// only if it has work ([`decode_attention_beside`]); folding, nothing launched where the
/// merge would have work (then `false`).
fn launch_decode<C: CacheRead>(
    kernel: DecodeKernel,
    launch: Launch<'_>,
    gpu: &Gpu,
    inputs: &AttentionInputs<'_, C>,
    workspace: &mut DecodeWorkspace,
    out: &mut impl DevicePtrMut<bf16>,
    lse: Option<&mut dyn DevicePtrMut<f32>>,
) -> Result<bool> {
    // BEGIN SOLUTION
    let shift = inputs.check(K, gpu)?;
    let (k_scale, v_scale, fp8) = inputs.scales(K)?;
    let (hq, d) = (inputs.num_q_heads, inputs.cache.head_dim);
    if !kernel.runs_on(gpu, d) {
        return Err(check::invalid(
            K,
            format!(
                "the bulk-copy kernel needs a Hopper GPU and head_dim 128 (here {} and {d})",
                gpu.arch()
            ),
        ));
    }
    let num_seqs = inputs.table.num_seqs();
    let rows = num_seqs * hq;
    check::at_least(K, "q", inputs.q.len(), rows * d)?;
    check::at_least(K, "output", out.len(), rows * d)?;
    let Some(slot_indptr) = &inputs.table.slot_indptr else {
        return Err(check::invalid(K, "the page table needs its slot_indptr"));
    };
    check::at_least(K, "slot_indptr", slot_indptr.len(), num_seqs + 1)?;
    let beside = launch.host_slots();
    if let Some(host) = beside {
        check_host_slots(host, num_seqs)?;
    }
    let fold = match launch {
        Launch::Folding { parts, pieces, .. } => {
            check::at_least(K, "parts.o", parts.o.len(), pieces * rows * d)?;
            check::at_least(K, "parts.lse", parts.lse.len(), pieces * rows)?;
            check::aligned(K, "parts.o", gpu.ptr(&parts.o))?;
            let pieces = check::int(K, "pieces", pieces)?;
            let stride = check::int(K, "rows", rows)?;
            Some((gpu.ptr(&parts.o), gpu.ptr(&parts.lse), pieces, stride))
        }
        _ => None,
    };
    check::at_least(
        K,
        "workspace",
        workspace.o.len(),
        2 * workspace.blocks * MAX_HEADS_PER_BLOCK * d,
    )?;
    let lse_ptr = match lse {
        Some(l) => {
            check::at_least(K, "lse", l.len(), rows)?;
            gpu.ptr_dyn(l)
        }
        None => 0,
    };
    if num_seqs == 0 {
        return Ok(true);
    }
    let out_ptr = gpu.ptr_mut(out);
    check::aligned(K, "output", out_ptr)?;
    let gh = heads_per_block(inputs.group());
    let shared = kernel.shared_bytes();
    let folding = launch.folding();
    let f = gpu.function_with(
        source(folding),
        kernel_name(kernel, d, gh, fp8, folding),
        shared,
    )?;
    let key = (kernel, d, inputs.group(), fp8, folding);
    let blocks = match workspace.grid {
        Some((k, blocks)) if k == key => blocks,
        _ => kernel_blocks(gpu, kernel, d, inputs.group(), fp8, folding)?.min(workspace.blocks),
    };
    let merge = beside.is_none_or(|host| merge_has_work(host, hq / gh, blocks));
    if folding && merge {
        return Ok(false);
    }
    // Kept only for a call that launches, so that a refused fold does not evict the grid of the
    // call that follows it.
    workspace.grid = Some((key, blocks));
    let (part_o, part_lse) = (
        gpu.ptr_mut(&mut workspace.o),
        gpu.ptr_mut(&mut workspace.lse),
    );
    let ptrs = [
        gpu.ptr(&inputs.q),
        inputs.k_cache.address(gpu),
        inputs.v_cache.address(gpu),
        gpu.ptr(&inputs.table.indptr),
        gpu.ptr(&inputs.table.page_ids),
        gpu.ptr(&inputs.table.page_lens),
        gpu.ptr(slot_indptr),
        out_ptr,
        lse_ptr,
        part_o,
        part_lse,
    ];
    let ints = [
        check::int(K, "num_seqs", num_seqs)?,
        check::int(K, "num_q_heads", hq)?,
        check::int(K, "num_kv_heads", inputs.cache.num_kv_heads)?,
        check::int(K, "page_size", inputs.cache.page_size)?,
        shift,
        check::int(K, "num_pages", inputs.cache.num_pages)?,
    ];
    let min_range = MIN_RANGE as i32;
    let mut config = grid((blocks as u32, 1, 1), kernel.threads());
    config.shared_mem_bytes = shared as u32;
    let mut args: Vec<_> = ptrs.iter().map(arg).chain(ints.iter().map(arg)).collect();
    args.extend([
        arg(&inputs.sm_scale),
        arg(&min_range),
        arg(&k_scale),
        arg(&v_scale),
    ]);
    // A folding kernel's parts: piece p's row r at p * rows + r.
    if let Some((o, lse, pieces, stride)) = &fold {
        args.extend([arg(o), arg(lse), arg(pieces), arg(stride)]);
    }
    unsafe { gpu.launch_args(K, &f, config, &mut args, beside.is_some()) }?;
    // Beside a cascade level this launch stands between the level's pass and the merge of its
    // parts, even with nothing to do: 2-5 us at 64 and 128 requests on an H100.
    if !merge {
        return Ok(true);
    }

    // The rows of sequences that blocks shared, from their pieces; launched so that it may start
    // while the decode kernel's last blocks run (it waits for them before reading a piece).
    const MERGE: &str = "decode_merge_pieces";
    let f = gpu.function(Source::DecodeAttention, MERGE)?;
    let (d_arg, gh_arg, blocks_arg) = (d as i32, gh as i32, blocks as i32);
    let mut args: [*mut std::ffi::c_void; 11] = [
        arg(&ptrs[6]),
        arg(&part_o),
        arg(&part_lse),
        arg(&out_ptr),
        arg(&lse_ptr),
        arg(&ints[0]),
        arg(&ints[1]),
        arg(&d_arg),
        arg(&gh_arg),
        arg(&blocks_arg),
        arg(&min_range),
    ];
    const MERGE_THREADS: u32 = 128;
    let warps_per_block = MERGE_THREADS as usize / 32;
    let config = grid((rows.div_ceil(warps_per_block) as u32, 1, 1), MERGE_THREADS);
    unsafe { gpu.launch_args(MERGE, &f, config, &mut args, true) }?;
    Ok(true)
    // END SOLUTION
}

/// The host's copy of a decode table's `slot_indptr`: `num_seqs + 1` prefix sums from 0.
fn check_host_slots(host: &[i32], num_seqs: usize) -> Result<()> {
    let problem = if host.len() != num_seqs + 1 {
        format!("has {} values for {num_seqs} sequences", host.len())
    } else if host[0] != 0 {
        format!("starts at {}, not 0", host[0])
    } else if let Some(i) = host.windows(2).position(|w| w[1] < w[0]) {
        format!("decreases after sequence {i}")
    } else {
        return Ok(());
    };
    Err(check::invalid(
        K,
        format!("the host's slot_indptr {problem}: it must be the table's prefix sums"),
    ))
}

/// Whether `decode_merge_pieces` has anything to write after the kernel: a head group's
/// segment (its sequence's slots, laid end to end once per group) that falls in two blocks'
/// ranges, or an empty one (whose rows the merge zeroes). The kernel's `block_range` and the
/// merge's test, on the host: they must stay the same. Walked with the position inside the
/// current range, no division a segment, as it runs for every layer of a cascade step.
fn merge_has_work(slot_indptr: &[i32], groups: usize, blocks: usize) -> bool {
    let slot = |i: i32| u64::try_from(i).expect("checked: prefix sums from 0");
    let all = slot(*slot_indptr.last().unwrap_or(&0));
    let range = (all * groups as u64)
        .div_ceil(blocks.max(1) as u64)
        .max(MIN_RANGE as u64)
        .next_multiple_of(SLOT_ALIGN as u64);
    let mut at = 0; // where the next segment starts, inside its range
    for w in slot_indptr.windows(2) {
        let seg = slot(w[1]) - slot(w[0]);
        for _ in 0..groups {
            if seg == 0 || at + seg > range {
                return true;
            }
            at += seg;
            if at == range {
                at = 0;
            }
        }
    }
    false
}

/// The blocks a decode call launches at `head_dim` and GQA group size `group` over a bf16
/// cache: as many as fit on the GPU at once, so that they all start together (one wave).
pub fn blocks(gpu: &Gpu, head_dim: usize, group: usize) -> Result<usize> {
    kernel_blocks(
        gpu,
        DecodeKernel::best(gpu, head_dim, group, false),
        head_dim,
        group,
        false,
        false,
    )
}

fn kernel_blocks(
    gpu: &Gpu,
    kernel: DecodeKernel,
    head_dim: usize,
    group: usize,
    fp8: bool,
    folding: bool,
) -> Result<usize> {
    let shared = kernel.shared_bytes();
    let f = gpu.function_with(
        source(folding),
        kernel_name(kernel, head_dim, heads_per_block(group), fp8, folding),
        shared,
    )?;
    let per_sm = f
        .occupancy_max_active_blocks_per_multiprocessor(kernel.threads(), shared, None)
        .during(K)? as usize;
    Ok(gpu.num_sms() * per_sm.clamp(1, MAX_BLOCKS_PER_SM))
}

/// The q heads one block serves: the largest of 8, 4, 2, 1 that divides the group.
fn heads_per_block(group: usize) -> usize {
    [8, 4, 2, 1]
        .into_iter()
        .find(|g| group.is_multiple_of(*g))
        .expect("1 divides everything")
}

/// The module of the folding kernels, or of the others.
fn source(folding: bool) -> Source {
    if folding {
        Source::DecodeFolding
    } else {
        Source::DecodeAttention
    }
}

/// The kernel's name; `folding` names a per-lane kernel's folding twin.
fn kernel_name(
    kernel: DecodeKernel,
    d: usize,
    gh: usize,
    fp8: bool,
    folding: bool,
) -> &'static str {
    const BF16: [[&str; 4]; 3] = [
        [
            "decode_attention_d32_g1",
            "decode_attention_d32_g2",
            "decode_attention_d32_g4",
            "decode_attention_d32_g8",
        ],
        [
            "decode_attention_d64_g1",
            "decode_attention_d64_g2",
            "decode_attention_d64_g4",
            "decode_attention_d64_g8",
        ],
        [
            "decode_attention_d128_g1",
            "decode_attention_d128_g2",
            "decode_attention_d128_g4",
            "decode_attention_d128_g8",
        ],
    ];
    const FP8: [[&str; 4]; 3] = [
        [
            "decode_attention_fp8_d32_g1",
            "decode_attention_fp8_d32_g2",
            "decode_attention_fp8_d32_g4",
            "decode_attention_fp8_d32_g8",
        ],
        [
            "decode_attention_fp8_d64_g1",
            "decode_attention_fp8_d64_g2",
            "decode_attention_fp8_d64_g4",
            "decode_attention_fp8_d64_g8",
        ],
        [
            "decode_attention_fp8_d128_g1",
            "decode_attention_fp8_d128_g2",
            "decode_attention_fp8_d128_g4",
            "decode_attention_fp8_d128_g8",
        ],
    ];
    const BULK: [[&str; 4]; 2] = [
        [
            "decode_attention_bulk_d128_g1",
            "decode_attention_bulk_d128_g2",
            "decode_attention_bulk_d128_g4",
            "decode_attention_bulk_d128_g8",
        ],
        [
            "decode_attention_bulk_fp8_d128_g1",
            "decode_attention_bulk_fp8_d128_g2",
            "decode_attention_bulk_fp8_d128_g4",
            "decode_attention_bulk_fp8_d128_g8",
        ],
    ];
    const FOLDING: [[[&str; 4]; 3]; 2] = [
        [
            [
                "decode_attention_folding_d32_g1",
                "decode_attention_folding_d32_g2",
                "decode_attention_folding_d32_g4",
                "decode_attention_folding_d32_g8",
            ],
            [
                "decode_attention_folding_d64_g1",
                "decode_attention_folding_d64_g2",
                "decode_attention_folding_d64_g4",
                "decode_attention_folding_d64_g8",
            ],
            [
                "decode_attention_folding_d128_g1",
                "decode_attention_folding_d128_g2",
                "decode_attention_folding_d128_g4",
                "decode_attention_folding_d128_g8",
            ],
        ],
        [
            [
                "decode_attention_folding_fp8_d32_g1",
                "decode_attention_folding_fp8_d32_g2",
                "decode_attention_folding_fp8_d32_g4",
                "decode_attention_folding_fp8_d32_g8",
            ],
            [
                "decode_attention_folding_fp8_d64_g1",
                "decode_attention_folding_fp8_d64_g2",
                "decode_attention_folding_fp8_d64_g4",
                "decode_attention_folding_fp8_d64_g8",
            ],
            [
                "decode_attention_folding_fp8_d128_g1",
                "decode_attention_folding_fp8_d128_g2",
                "decode_attention_folding_fp8_d128_g4",
                "decode_attention_folding_fp8_d128_g8",
            ],
        ],
    ];
    let row = match d {
        32 => 0,
        64 => 1,
        _ => 2,
    };
    let col = match gh {
        1 => 0,
        2 => 1,
        4 => 2,
        _ => 3,
    };
    if folding {
        return FOLDING[fp8 as usize][row][col];
    }
    match (kernel, fp8) {
        (DecodeKernel::BulkCopies, _) => BULK[fp8 as usize][col],
        (DecodeKernel::Loads, true) => FP8[row][col],
        (DecodeKernel::Loads, false) => BF16[row][col],
    }
}

#[cfg(test)]
mod tests {
    use super::{MIN_RANGE, merge_has_work};
    use crate::paged::SLOT_ALIGN;
    use proptest::prelude::*;

    /// `n` sequences of `slots` slots each.
    fn line(n: i32, slots: i32) -> Vec<i32> {
        (0..=n).map(|i| i * slots).collect()
    }

    #[test]
    fn the_merge_has_work_only_where_a_segment_is_cut_or_empty() {
        // Cascade's own pages at 64 requests: 64 slots x 8 head groups over a wave of 660
        // blocks gives ranges of MIN_RANGE (64), one segment each.
        assert!(!merge_has_work(&line(64, 64), 8, 660));
        // A segment of 96 slots after one of 32 crosses a range of 64.
        assert!(merge_has_work(&[0, 32, 128], 8, 660));
        // Segments of 96 slots where the ranges are 96 too (64 x 96 x 8 slots over 660 blocks).
        assert!(!merge_has_work(&line(64, 96), 8, 660));
        // 100 blocks: ranges of 352 slots, which cut some segments of 64.
        assert!(merge_has_work(&line(64, 64), 8, 100));
        // A sequence with no slots: the merge writes its zero rows.
        assert!(merge_has_work(&[0, 64, 64, 128], 8, 660));
        // The cascade bench's own pages at 128 requests (ranges of 128) and 256 (ranges of 224,
        // which cut some of the 64-slot segments).
        assert!(!merge_has_work(&line(128, 64), 8, 660));
        assert!(merge_has_work(&line(256, 64), 8, 660));
        // Ranges are rounded up to SLOT_ALIGN (32): 5 segments of 32 over 2 blocks give ranges
        // of 96, not 80 (which would cut the third).
        assert!(!merge_has_work(&line(5, 32), 1, 2));
        // One sequence of two segments, a block each, or two blocks each.
        assert!(!merge_has_work(&line(1, 1024), 2, 2));
        assert!(merge_has_work(&line(1, 1024), 2, 4));
    }

    proptest! {
        /// The walk that keeps its place inside the current range agrees with the merge
        /// kernel's test, segment by segment: first and last slot in different ranges.
        #[test]
        fn the_walk_agrees_with_the_merge_kernels_test(
            lens in prop::collection::vec(0i32..40, 1..48),
            groups in 1usize..9,
            blocks in 1usize..800,
        ) {
            let mut slots = vec![0];
            for l in lens {
                slots.push(slots.last().unwrap() + l * SLOT_ALIGN as i32);
            }
            let (g, all) = (groups as i64, i64::from(*slots.last().unwrap()));
            let align = SLOT_ALIGN as i64;
            let range = ((all * g + blocks as i64 - 1) / blocks as i64).max(MIN_RANGE as i64);
            let range = (range + align - 1) / align * align;
            let cut = slots.windows(2).any(|w| {
                let seg = i64::from(w[1] - w[0]);
                seg == 0
                    || (0..g).any(|h| {
                        let first = i64::from(w[0]) * g + h * seg;
                        first / range != (first + seg - 1) / range
                    })
            });
            prop_assert_eq!(merge_has_work(&slots, groups, blocks), cut);
        }
    }
}
