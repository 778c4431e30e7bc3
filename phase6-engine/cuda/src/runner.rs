//! The CUDA runner: the model's forward pass on an NVIDIA GPU, through the `kernels` crate.
//!
//! It gives the CPU runner's tokens (up to bf16 rounding) much faster. At construction it
//! uploads the weights in bf16 (q/k/v and gate/up fused), allocates every activation buffer for
//! the largest step it will be given, and sizes one K and one V buffer for all layers from what
//! is left of `gpu_memory_utilization` of the device's memory, as vLLM does. Each step is
//! planned on the host ([`phase6_cuda_plan`]), uploaded in one copy ([`staging`]) and queued as one
//! sequence of launches ([`forward`]) with no host synchronisation until the results are read
//! back: the logits, or only the token ids when sampling on the device. Decode steps are
//! replayed from CUDA graphs unless `enforce_eager` is set ([`crate::graphs`]). Steps may also
//! be launched without waiting ([`QueuedRunner`]): the engine then decides the next step while
//! this one runs, and a decode's input can be the token the step before samples, which the
//! runner takes on the device ([`crate::overlap`]). Segments several sequences of a step share
//! are attended as cascade groups ([`phase6_chunks::plan_cascade`]), and KV that few queries
//! see whole (a shared segment, the cached context before a prefill's new tokens) in pieces
//! attended at once ([`phase6_cuda_plan::split`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::time::Instant;

use kernels::paged::CacheShape;
use kernels::prefill::PrefillKernel;
use kernels::{CudaEvent, Gpu, PinnedHostSlice, decode, gather, sampling};
use phase0::{SeqId, TokenId};
use phase1::{BlockTable, KvDtype, KvLayout};
use phase2::{Error, ForwardBatch, Logits, ModelConfig, ModelRunner, Weights};
use phase6_chunks::{CascadeStats, ChunkRunner, SharedSegment, check_copy_kv, plan_cascade};

use crate::forward::{self, Activations, DeviceModel, Dims, KvCache};
use crate::graphs::{self, DecodeGraphs};
use crate::overlap::{PENDING_TOKEN, QueuedRunner};
use crate::staging::Staging;
use phase6_cuda_plan::{KvSplit, Limits, StepPlan};
use phase6_cuda_weights::{DeviceWeights, device_error, driver_error};

/// cuBLAS's fixed scratch memory (what Hopper GEMMs ask for at most).
const BLAS_WORKSPACE: usize = 32 << 20;
/// Device memory left free for what is not counted (the CUDA context's own growth).
const RESERVE: usize = 256 << 20;
/// Device memory left free for the decode graphs' instantiation.
const GRAPH_RESERVE: usize = 512 << 20;
/// Page entries a sequence may use in a graph-replayed step, beyond its full pages (one
/// partly filled page per segment).
const SPARE_ENTRIES: usize = 4;

/// How to set the runner up.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// CUDA device ordinal.
    pub device: usize,
    /// Tokens per KV page: a power of two, at least 16 (the attention kernels' tiles).
    pub page_size: usize,
    /// Share of the device's memory the runner may fill, KV cache included.
    pub gpu_memory_utilization: f32,
    /// A fixed number of KV pages instead of what the memory share allows.
    pub num_pages: Option<usize>,
    /// Most tokens in one step (sizes the activation buffers).
    pub max_num_batched_tokens: usize,
    /// Most sequences in one step (sizes the lm_head buffers and the decode graphs).
    pub max_num_seqs: usize,
    /// Launch every kernel of every step one by one (no CUDA graphs): for debugging.
    pub enforce_eager: bool,
    /// The shortest piece (at least a page) that KV attended without the causal mask is cut
    /// into: a cascade group's shared segment, or the cached context before a prefill's new
    /// tokens. Few queries over a long KV are attended in several pieces at once so that they
    /// fill the GPU (`phase6_cuda_plan::split`); KV of less than three pieces' worth stays
    /// whole. On an H100, with pages of 256, the default leaves a 16-token question's 1k-token
    /// context whole (2.6 ms to the first token against 2.8 in 4 pieces: the host's launches
    /// set the pace there), cuts a 4k-token one into 8 (2.8-2.9 ms against 3.1-3.2 in 4) and a
    /// 16k-token one into 16 (128 blocks: one wave of the Hopper kernel), and a 4k-token prefix
    /// shared by 64 or 128 decoding requests into 8: the fastest counts, or within 2% of them,
    /// in `cargo bench -p kernels --bench cascade`.
    pub split_kv_min_tokens: usize,
    /// How the KV cache holds K and V: `BF16`, or `Fp8E4m3` (half the bytes a token; GPUs with
    /// FP8 conversion instructions, compute capability 8.9 and newer).
    pub kv_cache_dtype: KvDtype,
}

impl Default for CudaOptions {
    fn default() -> Self {
        Self {
            device: 0,
            page_size: 256,
            gpu_memory_utilization: 0.9,
            num_pages: None,
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
            enforce_eager: false,
            split_kv_min_tokens: 384,
            kv_cache_dtype: KvDtype::BF16,
        }
    }
}

/// Where the device's memory went, for the engine to print at start.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryReport {
    pub device: String,
    pub total_bytes: usize,
    pub weights_bytes: usize,
    /// Activation buffers, decode workspace and staging buffers.
    pub activation_bytes: usize,
    pub kv_bytes: usize,
    pub kv_cache_dtype: KvDtype,
    pub num_pages: usize,
    pub page_size: usize,
    pub num_graphs: usize,
    /// Device memory the graphs took when they were captured.
    pub graph_bytes: usize,
    /// Seconds spent opening the device (context, cuBLAS, kernels), loading the weights, and
    /// allocating the KV cache and capturing the graphs: what start-up is made of.
    pub startup_seconds: [f64; 3],
}

impl MemoryReport {
    /// Tokens the KV cache holds.
    pub fn kv_tokens(&self) -> usize {
        self.num_pages * self.page_size
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "{} ({:.1} GiB): weights {:.2} GiB, activations {:.2} GiB, KV cache{} {:.2} GiB = {} pages x {} tokens ({} tokens)",
            self.device,
            gib(self.total_bytes),
            gib(self.weights_bytes),
            gib(self.activation_bytes),
            match self.kv_cache_dtype {
                KvDtype::Fp8E4m3 => " (FP8 E4M3, 1 byte an element)",
                _ => "",
            },
            gib(self.kv_bytes),
            self.num_pages,
            self.page_size,
            self.kv_tokens(),
        )?;
        match self.num_graphs {
            0 => write!(f, ", eager (no CUDA graphs)")?,
            n => write!(f, ", {n} decode graphs ({:.2} GiB)", gib(self.graph_bytes))?,
        }
        let [device, weights, rest] = self.startup_seconds;
        write!(
            f,
            "; ready in {:.2} s (device {device:.2} s, weights {weights:.2} s, KV cache and graphs {rest:.2} s)",
            device + weights + rest
        )
    }
}

pub struct CudaRunner {
    gpu: Gpu,
    dims: Dims,
    limits: Limits,
    model: Box<dyn DeviceModel>,
    act: Activations,
    kv: KvCache,
    staging: Staging,
    /// Where sampled token ids come back to (pinned: see `Gpu::download_pinned`).
    sampled_host: PinnedHostSlice<u32>,
    /// Launched steps: two buffers the ids of two steps in flight come back to, taken in turn,
    /// each with the event recorded after its copy.
    launched_host: [PinnedHostSlice<u32>; 2],
    launched_done: [CudaEvent; 2],
    /// Steps launched and not collected: (sampled rows, buffer).
    in_flight: VecDeque<(usize, usize)>,
    next_buffer: usize,
    /// The row of each sequence's token in the last launched step's sampled ids.
    last_rows: HashMap<SeqId, u32>,
    graphs: Option<DecodeGraphs>,
    options: CudaOptions,
    memory: MemoryReport,
    cascade: CascadeStats,
}

impl CudaRunner {
    /// Opens the device, uploads `weights`, sizes the KV cache and, unless
    /// `options.enforce_eager`, captures the decode graphs.
    pub fn new(
        config: &ModelConfig,
        weights: &Weights,
        options: CudaOptions,
    ) -> Result<Self, Error> {
        Self::with_model(config, options, |gpu| {
            Ok(Box::new(DeviceWeights::upload(gpu, config, weights)?))
        })
    }

    /// [`CudaRunner::new`] for the model `load` puts on the device once it is open: the whole
    /// model, or one rank's part of a split one (chapter 6.5; `config` then has the rank's
    /// heads and intermediate size, and the whole vocabulary its logits are gathered into).
    pub fn with_model(
        config: &ModelConfig,
        options: CudaOptions,
        load: impl FnOnce(&Gpu) -> Result<Box<dyn DeviceModel>, Error>,
    ) -> Result<Self, Error> {
        check_supported(config, &options)?;
        let _turn = start_turn(options.device);
        let dims = Dims::new(config);
        let start = Instant::now();
        let mut gpu = Gpu::open(options.device).map_err(device_error)?;
        gpu.fix_blas_workspace(BLAS_WORKSPACE)
            .map_err(device_error)?;
        gpu.preload().map_err(device_error)?;
        let device = gpu.name().map_err(device_error)?;
        let arch = gpu.arch();
        if options.kv_cache_dtype == KvDtype::Fp8E4m3 && (arch.major, arch.minor) < (8, 9) {
            return Err(Error::Device(format!(
                "an FP8 KV cache needs FP8 conversion instructions (compute capability 8.9 or \
                 newer); {device} is {}.{}",
                arch.major, arch.minor
            )));
        }
        let opened = start.elapsed().as_secs_f64();
        let mut model = load(&gpu)?;
        let loaded = start.elapsed().as_secs_f64();

        let (hq, hkv) = (dims.heads, dims.kv_heads);
        let (tokens, seqs) = (options.max_num_batched_tokens, options.max_num_seqs);
        let mut act = Activations::new(&gpu, &dims, tokens, seqs).map_err(device_error)?;
        let staging = Staging::new(&gpu, 8 * tokens + 16 * seqs + 4096).map_err(device_error)?;

        let (free, total) = gpu.memory_info().map_err(device_error)?;
        let shape = CacheShape {
            num_pages: kv_pages(config, &options, free, total)?,
            num_kv_heads: hkv,
            page_size: options.page_size,
            head_dim: dims.head_dim,
        };
        let mut kv =
            KvCache::new(&gpu, dims.layers, shape, options.kv_cache_dtype).map_err(device_error)?;
        let fp8 = options.kv_cache_dtype == KvDtype::Fp8E4m3;
        let prefill_kernel = PrefillKernel::best_for(&gpu, dims.head_dim, fp8);
        let (block_rows, blocks_at_once) = prefill_kernel.wave(&gpu);
        let limits = Limits {
            page_size: options.page_size,
            num_pages: shape.num_pages,
            vocab_size: dims.vocab,
            max_position: config.max_position_embeddings,
            max_tokens: tokens,
            max_seqs: seqs,
            split: KvSplit {
                block_rows,
                blocks_at_once,
                q_per_kv: hq / hkv.max(1),
                kv_heads: hkv,
                min_tokens: options.split_kv_min_tokens.max(options.page_size),
                decode_beside: prefill_kernel.lets_dependents_start(),
                fold_blocks: decode::folding_blocks(&gpu, dims.head_dim, hq / hkv.max(1), fp8)
                    .map_err(device_error)?,
            },
        };

        let (before, _) = gpu.memory_info().map_err(device_error)?;
        let graphs = if options.enforce_eager {
            None
        } else {
            let max_pages = config
                .max_position_embeddings
                .div_ceil(options.page_size)
                .min(shape.num_pages);
            let model = graphs::Model {
                dims: &dims,
                model: &mut *model,
                act: &mut act,
                kv: &mut kv,
            };
            let entries = max_pages + SPARE_ENTRIES;
            Some(DecodeGraphs::capture(&gpu, model, &limits, entries).map_err(device_error)?)
        };
        let (after, _) = gpu.memory_info().map_err(device_error)?;
        let ready = start.elapsed().as_secs_f64();

        let memory = MemoryReport {
            device,
            total_bytes: total,
            weights_bytes: model.weights().bytes(),
            activation_bytes: act.bytes()
                + staging.bytes()
                + graphs.as_ref().map_or(0, DecodeGraphs::staging_bytes)
                + BLAS_WORKSPACE,
            kv_bytes: kv.bytes(),
            kv_cache_dtype: kv.dtype(),
            num_pages: shape.num_pages,
            page_size: options.page_size,
            num_graphs: graphs.as_ref().map_or(0, DecodeGraphs::len),
            graph_bytes: before.saturating_sub(after),
            startup_seconds: [opened, loaded - opened, ready - loaded],
        };
        let sampled_host = gpu.pinned(options.max_num_seqs).map_err(device_error)?;
        let launched_host = [
            gpu.pinned(options.max_num_seqs).map_err(device_error)?,
            gpu.pinned(options.max_num_seqs).map_err(device_error)?,
        ];
        let launched_done = [
            gpu.event().map_err(device_error)?,
            gpu.event().map_err(device_error)?,
        ];
        Ok(Self {
            launched_host,
            launched_done,
            in_flight: VecDeque::new(),
            next_buffer: 0,
            last_rows: HashMap::new(),
            gpu,
            dims,
            limits,
            model,
            act,
            kv,
            staging,
            sampled_host,
            graphs,
            options,
            memory,
            cascade: CascadeStats::default(),
        })
    }

    pub fn memory_report(&self) -> &MemoryReport {
        &self.memory
    }

    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// What a step is planned within: the pool, the step's size and how unmasked KV is cut.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Plans, uploads and queues one step (sampling on the device if `sample`); returns how
    /// many rows of logits (and of token ids, when sampled) it produced.
    /// `batch` may hold [`PENDING_TOKEN`] inputs only when it comes from `launch`.
    fn step(&mut self, batch: &ForwardBatch, sample: bool, launched: bool) -> Result<usize, Error> {
        let shared = plan_cascade(batch);
        self.cascade.record(batch, &shared);
        self.step_planned(batch, &shared, sample, launched)
    }

    /// [`CudaRunner::step`] with the cascade groups given.
    fn step_planned(
        &mut self,
        batch: &ForwardBatch,
        shared: &[SharedSegment],
        sample: bool,
        launched: bool,
    ) -> Result<usize, Error> {
        let mut plan = StepPlan::new(batch, shared, &self.limits)?;
        let n = plan.num_sampled;
        if plan.num_tokens() == 0 {
            return Ok(0);
        }
        let pending = self.mark_pending(batch, &mut plan, launched)?;
        let prev = pending.then(|| self.act.sampled.slice(..));
        let replayed = match &mut self.graphs {
            Some(graphs) if plan.is_flat_decode() => graphs
                .replay(&self.gpu, &mut plan, prev.as_ref())
                .map_err(device_error)?,
            _ => None,
        };
        let params = match (replayed, &self.graphs) {
            (Some(region), Some(graphs)) => graphs.params(region),
            _ => {
                let layout = self.staging.pack(&plan, 0);
                self.staging
                    .upload(&self.gpu, &layout)
                    .map_err(device_error)?;
                if let Some(prev) = &prev {
                    gather::take_pending(&self.gpu, &mut self.staging.ids_mut(&layout), prev)
                        .map_err(device_error)?;
                }
                let inputs = self.staging.inputs(&layout);
                self.model
                    .forward(&self.gpu, &self.dims, &mut self.act, &mut self.kv, &inputs)
                    .map_err(device_error)?;
                self.staging.params(layout.params_region())
            }
        };
        if sample && n > 0 {
            let (logits, out) = (&self.act.logits, &mut self.act.sampled);
            sampling::sample(&self.gpu, logits, &params, out, n, self.dims.vocab)
                .map_err(device_error)?;
        }
        if n == 0 {
            // Nothing is read back: wait here, so that the next step may rewrite the staging
            // buffer this one was copied from.
            self.gpu.synchronize().map_err(device_error)?;
        }
        Ok(n)
    }
}

impl CudaRunner {
    /// Points each [`PENDING_TOKEN`] input at the row of the last launched step's sampled ids
    /// that holds it (a decode-only step: row i is sequence i). True if there was any.
    fn mark_pending(
        &self,
        batch: &ForwardBatch,
        plan: &mut StepPlan,
        launched: bool,
    ) -> Result<bool, Error> {
        let mut any = false;
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.tokens.first() != Some(&PENDING_TOKEN) {
                continue;
            }
            let row = match self.last_rows.get(&s.seq_id) {
                Some(&row) if launched && plan.is_flat_decode() => row,
                _ => {
                    return Err(Error::InvalidBatch(format!(
                        "sequence {}: a pending input needs a decode step launched right after \
                         one that samples it",
                        s.seq_id
                    )));
                }
            };
            plan.ids[i] = gather::pending_id(row);
            any = true;
        }
        Ok(any)
    }
}

/// Runners starting on the same device in one process take turns: while one captured its
/// graphs, another one starting beside it made a cuBLAS call fail ("execution failed") in
/// about one run in two of the GPU tests, with or without any change to the runner. Ranks on
/// different devices still start together, as the NCCL group they join needs.
fn start_turn(device: usize) -> std::sync::MutexGuard<'static, ()> {
    static TURNS: [std::sync::Mutex<()>; 16] = [const { std::sync::Mutex::new(()) }; 16];
    TURNS[device % TURNS.len()]
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Shapes the kernels cannot run are refused before anything is allocated.
fn check_supported(c: &ModelConfig, o: &CudaOptions) -> Result<(), Error> {
    let refuse = |s: String| {
        Err(Error::Device(format!(
            "the CUDA runner cannot run this: {s}"
        )))
    };
    if !matches!(c.head_dim, 32 | 64 | 128) {
        return refuse(format!("head_dim {} (supported: 32, 64, 128)", c.head_dim));
    }
    if !c.hidden_size.is_multiple_of(8) || !c.intermediate_size.is_multiple_of(8) {
        return refuse(format!(
            "hidden size {} and intermediate size {} must be multiples of 8",
            c.hidden_size, c.intermediate_size
        ));
    }
    if !o.page_size.is_power_of_two() || o.page_size < 16 {
        return refuse(format!(
            "page_size {} (a power of two, at least 16)",
            o.page_size
        ));
    }
    if o.max_num_batched_tokens == 0 || o.max_num_seqs == 0 {
        return refuse("max_num_batched_tokens and max_num_seqs must be positive".into());
    }
    if !matches!(o.kv_cache_dtype, KvDtype::BF16 | KvDtype::Fp8E4m3) {
        return refuse(format!(
            "a {:?} KV cache (supported: bf16, FP8 E4M3)",
            o.kv_cache_dtype
        ));
    }
    if !(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0) {
        return refuse(format!(
            "gpu_memory_utilization {} (must be in (0, 1])",
            o.gpu_memory_utilization
        ));
    }
    Ok(())
}

/// KV pages: the fixed number asked for, or what fits in the memory share once everything
/// else is allocated (`free` of `total` bytes are free now).
fn kv_pages(c: &ModelConfig, o: &CudaOptions, free: usize, total: usize) -> Result<usize, Error> {
    let element = o.kv_cache_dtype.size_bytes();
    let page_bytes = 2 * c.num_layers * c.num_kv_heads * o.page_size * c.head_dim * element;
    let reserve = RESERVE + if o.enforce_eager { 0 } else { GRAPH_RESERVE };
    let available = free.saturating_sub(reserve);
    let pages = match o.num_pages {
        Some(n) if n * page_bytes > available => {
            return Err(Error::OutOfMemory(format!(
                "{n} KV pages need {} MiB, {} MiB of device memory are free",
                (n * page_bytes) >> 20,
                available >> 20
            )));
        }
        Some(n) => n,
        None => {
            let share = (o.gpu_memory_utilization as f64 * total as f64) as usize;
            let used = total - free;
            share.saturating_sub(used + reserve).min(available) / page_bytes.max(1)
        }
    };
    // The kernels index a layer's cache rows with 32-bit integers.
    let pages = pages.min(i32::MAX as usize / (c.num_kv_heads * o.page_size));
    if pages == 0 {
        return Err(Error::OutOfMemory(format!(
            "no device memory left for the KV cache ({} MiB free of {} MiB, utilization {})",
            free >> 20,
            total >> 20,
            o.gpu_memory_utilization
        )));
    }
    Ok(pages)
}

impl Drop for CudaRunner {
    /// The decode graphs go before the model they replay. A graph that captured an NCCL
    /// collective (a tensor-parallel rank, chapter 6.5) holds a reference on the communicator,
    /// which waits for every such graph to be destroyed before it frees itself.
    fn drop(&mut self) {
        self.graphs = None;
    }
}

impl ModelRunner for CudaRunner {
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            num_layers: self.dims.layers,
            num_kv_heads: self.dims.kv_heads,
            head_dim: self.dims.head_dim,
            dtype: self.kv.dtype(),
        }
    }

    fn num_pages(&self) -> usize {
        self.kv.shape.num_pages
    }

    fn page_size(&self) -> usize {
        self.kv.shape.page_size
    }

    fn vocab_size(&self) -> usize {
        self.dims.vocab
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        let shared = plan_cascade(batch);
        self.cascade.record(batch, &shared);
        self.forward_planned(batch, &shared)
    }

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        let n = self.step(batch, true, false)?;
        match n {
            0 => Ok(Vec::new()),
            n => self
                .gpu
                .download_pinned(&self.act.sampled.slice(..n), &mut self.sampled_host)
                .map(<[u32]>::to_vec)
                .map_err(device_error),
        }
    }
}

impl CudaRunner {
    /// One step with the cascade groups given (an empty plan is flat attention), logits back.
    pub fn forward_planned(
        &mut self,
        batch: &ForwardBatch,
        shared: &[SharedSegment],
    ) -> Result<Logits, Error> {
        let n = self.step_planned(batch, shared, false, false)?;
        let vocab_size = self.dims.vocab;
        let data = match n {
            0 => Vec::new(),
            n => self
                .gpu
                .download(&self.act.logits.slice(..n * vocab_size))
                .map_err(device_error)?,
        };
        Ok(Logits { vocab_size, data })
    }
}

impl ChunkRunner for CudaRunner {
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        let ps = self.kv.shape.page_size;
        check_copy_kv(src, dst, ps, self.kv.shape.num_pages)?;
        let n = src.num_tokens();
        // Every token is copied at once on the device, so a page both read and written would
        // make the result depend on the order of the blocks.
        if let Some(p) = src.pages().iter().find(|p| dst.pages().contains(p)) {
            return Err(Error::InvalidBatch(format!(
                "copy reads and writes page {p}"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let slots = |table: &BlockTable| -> Vec<i32> {
            (0..n)
                .flat_map(|i| {
                    let s = table.slot(i, ps);
                    [s.page as i32, s.offset as i32]
                })
                .collect()
        };
        let gpu = &self.gpu;
        let (d_src, d_dst) = (
            gpu.upload(&slots(src)).map_err(device_error)?,
            gpu.upload(&slots(dst)).map_err(device_error)?,
        );
        forward::copy_kv_rotated(
            gpu,
            &self.dims,
            &self.model.weights().rope_inv_freq,
            &mut self.kv,
            &d_src,
            &d_dst,
            n,
            rope_shift,
        )
        .map_err(device_error)?;
        // Chunk registration is rare: wait, so that the slot arrays outlive the copies.
        gpu.synchronize().map_err(device_error)
    }

    fn cascade_stats(&self) -> CascadeStats {
        self.cascade
    }
}

impl QueuedRunner for CudaRunner {
    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        let n = self.step(batch, true, true)?;
        let buffer = self.next_buffer;
        if n > 0 {
            // The other buffer may still be read for the step launched before this one.
            let host = &mut self.launched_host[buffer];
            let done = &self.launched_done[buffer];
            self.gpu
                .queue_download(&self.act.sampled.slice(..n), host, done)
                .map_err(device_error)?;
            self.next_buffer ^= 1;
        }
        let sampling = batch.seqs.iter().filter(|s| s.sample.is_some());
        self.last_rows = sampling.map(|s| s.seq_id).zip(0..n as u32).collect();
        self.in_flight.push_back((n, buffer));
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        let (n, buffer) = self
            .in_flight
            .pop_front()
            .ok_or_else(|| Error::InvalidBatch("no launched step to collect".into()))?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let driver = |e| driver_error("reading sampled ids", e);
        self.launched_done[buffer].synchronize().map_err(driver)?;
        let ids = self.launched_host[buffer].as_slice().map_err(driver)?;
        Ok(ids[..n].to_vec())
    }
}
