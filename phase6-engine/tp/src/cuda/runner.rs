//! Chapter 6.5: the tensor-parallel CUDA runner: one thread per GPU, each with chapter 6.4's
//! runner (its own context, stream, KV cache and CUDA graphs) around its [`RankModel`].
//!
//! The scheduler runs once; every step is handed to all ranks, which plan it alike (the same
//! batch gives the same plan), run it with their collectives recorded in the same order (into
//! their graphs too: NCCL calls are captured like kernels), and answer. Rank 0's answer is the
//! step's. Ranks are made together, because joining the NCCL group waits for all of them.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use phase0::TokenId;
use phase1::{BlockTable, KvLayout};
use phase2::{Error, ForwardBatch, Logits, ModelConfig, ModelRunner, Weights};
use phase6::{Config, Device, Runner};
use phase6_chunks::{CascadeStats, ChunkRunner};
use phase6_cuda::{CudaOptions, CudaRunner, DeviceWeights, MemoryReport, QueuedRunner};
use phase6_cuda_weights::device_error;

use crate::cuda::nccl::{self, NcclGroup};
use crate::cuda::rank_model::RankModel;
use crate::cuda::shard_source::ShardSource;
use crate::shard::{Shard, check_split};

type Answer = Result<Box<dyn Any + Send>, Error>;
type Job = Box<dyn FnOnce(&mut CudaRunner) -> Answer + Send>;

/// A rank's thread, and the two channels to it.
struct RankThread {
    jobs: Sender<Job>,
    answers: Receiver<Answer>,
    thread: Option<JoinHandle<()>>,
}

/// `tensor_parallel_size` GPUs running one model.
pub struct TpCudaRunner {
    ranks: Vec<RankThread>,
    kv_layout: KvLayout,
    num_pages: usize,
    page_size: usize,
    vocab_size: usize,
    memory: MemoryReport,
}

impl TpCudaRunner {
    /// Splits the model over GPUs `options.device..options.device + tp`, every rank's K/V
    /// cache sized as `options` says for its own heads.
    pub fn new(
        config: &ModelConfig,
        weights: &Weights,
        options: CudaOptions,
        tp: usize,
    ) -> Result<Self, Error> {
        check_split(config, tp).map_err(|reason| Error::model_load("config.json", reason))?;
        let found = kernels::device_count().map_err(device_error)?;
        if found < options.device + tp {
            return Err(Error::Device(format!(
                "tensor_parallel_size = {tp} from cuda:{} needs {} GPUs, {found} found",
                options.device,
                options.device + tp
            )));
        }
        nccl::ensure_loadable(false).map_err(Error::Device)?;
        // One group starts at a time: each rank waits for its device's turn to start
        // (`CudaRunner::with_model`), and two groups taking turns on two devices in opposite
        // orders would each hold a device the other waits for.
        static GROUP_START: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _turn = GROUP_START
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = nccl::new_group_id().map_err(Error::Device)?;
        let started = Arc::new(AtomicBool::new(false));
        let each = ShardSource::vocab_rows(config, tp);
        let runners: Vec<Result<CudaRunner, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..tp)
                .map(|rank| {
                    let options = CudaOptions {
                        device: options.device + rank,
                        ..options.clone()
                    };
                    let started = started.clone();
                    s.spawn(move || {
                        make_rank(config, weights, options, (rank, tp), each, id, started)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank panicked while starting"))
                .collect()
        });
        // Until `started` is set, a rank's runner frees no communicator (see `NcclGroup`): the
        // failure is reported rather than waited on.
        let runners = runners.into_iter().collect::<Result<Vec<_>, _>>()?;
        let num_pages = runners.iter().map(|r| r.num_pages()).min().unwrap_or(0);
        if runners.iter().any(|r| r.num_pages() != num_pages) {
            let pages: Vec<_> = runners.iter().map(|r| r.num_pages()).collect();
            return Err(Error::OutOfMemory(format!(
                "the ranks' GPUs hold different numbers of KV pages ({pages:?}): fix the number \
                 with num_kvcache_blocks (CudaOptions::num_pages)"
            )));
        }
        started.store(true, Ordering::Release);
        let first = &runners[0];
        let (kv_layout, page_size, vocab_size) =
            (first.kv_layout(), first.page_size(), first.vocab_size());
        let memory = first.memory_report().clone();
        let ranks = runners.into_iter().map(RankThread::start).collect();
        Ok(Self {
            ranks,
            kv_layout,
            num_pages,
            page_size,
            vocab_size,
            memory,
        })
    }

    pub fn tensor_parallel_size(&self) -> usize {
        self.ranks.len()
    }

    /// Rank 0's device memory (every rank's is alike).
    pub fn memory_report(&self) -> &MemoryReport {
        &self.memory
    }

    /// Runs `job` on every rank at once; rank 0's answer (or the first failure).
    fn on_all_ranks<T: Send + 'static>(
        &self,
        job: impl Fn(&mut CudaRunner) -> Result<T, Error> + Send + Sync + 'static,
    ) -> Result<T, Error> {
        self.on_ranks(self.ranks.len(), job)
    }

    /// Runs `job` on ranks `0..n` (all of them when it runs collectives); rank 0's answer.
    fn on_ranks<T: Send + 'static>(
        &self,
        n: usize,
        job: impl Fn(&mut CudaRunner) -> Result<T, Error> + Send + Sync + 'static,
    ) -> Result<T, Error> {
        let ranks = &self.ranks[..n];
        let job = Arc::new(job);
        for rank in ranks {
            let job = job.clone();
            let boxed: Job = Box::new(move |r| job(r).map(|t| Box::new(t) as Box<dyn Any + Send>));
            rank.jobs
                .send(boxed)
                .map_err(|_| Error::Device("a tensor-parallel rank has stopped".into()))?;
        }
        let mut answers = Vec::with_capacity(n);
        for rank in ranks {
            answers.push(rank.answers.recv().unwrap_or_else(|_| {
                Err(Error::Device("a tensor-parallel rank has stopped".into()))
            }));
        }
        let mut answers = answers.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(*answers
            .swap_remove(0)
            .downcast::<T>()
            .expect("every rank answers with the job's type"))
    }
}

/// Rank `rank`'s runner: its GPU, its slices of the weights, its place in the NCCL group.
fn make_rank(
    config: &ModelConfig,
    weights: &Weights,
    options: CudaOptions,
    (rank, tp): (usize, usize),
    each: usize,
    id: [std::ffi::c_char; 128],
    started: Arc<AtomicBool>,
) -> Result<CudaRunner, Error> {
    let shard = Shard {
        rank,
        world_size: tp,
    };
    // The kernels run the rank's heads and intermediate slice; the logits they are gathered
    // into span the whole vocabulary, while the rank's embedding and lm_head hold `each` rows.
    let narrow = shard.config(config);
    let rank_config = ModelConfig {
        vocab_size: config.vocab_size,
        ..narrow.clone()
    };
    let weights_config = ModelConfig {
        vocab_size: each,
        ..narrow
    };
    let max_seqs = options.max_num_seqs;
    CudaRunner::with_model(&rank_config, options, |gpu| {
        let group = NcclGroup::join(gpu, rank, tp, id, started).map_err(Error::Device)?;
        let source = ShardSource::new(weights, config, shard);
        let w = DeviceWeights::upload(gpu, &weights_config, &source)?;
        let model = RankModel::new(gpu, w, group, each, max_seqs).map_err(device_error)?;
        Ok(Box::new(model))
    })
}

impl RankThread {
    fn start(mut runner: CudaRunner) -> Self {
        let (jobs, inbox) = channel::<Job>();
        let (outbox, answers) = channel::<Answer>();
        let thread = std::thread::spawn(move || {
            for job in inbox {
                if outbox.send(job(&mut runner)).is_err() {
                    break;
                }
            }
        });
        Self {
            jobs,
            answers,
            thread: Some(thread),
        }
    }
}

impl Drop for TpCudaRunner {
    /// Closes every rank's job channel, which ends its loop and drops its runner, before
    /// waiting for any of them: the ranks free their communicators together, as NCCL needs
    /// (dropped one after another, the first would wait forever for the rest).
    fn drop(&mut self) {
        for rank in &mut self.ranks {
            let (closed, _) = channel();
            drop(std::mem::replace(&mut rank.jobs, closed));
        }
        for rank in &mut self.ranks {
            if let Some(thread) = rank.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl ModelRunner for TpCudaRunner {
    /// The K/V of one rank: what each GPU holds per token.
    fn kv_layout(&self) -> KvLayout {
        self.kv_layout
    }

    fn num_pages(&self) -> usize {
        self.num_pages
    }

    fn page_size(&self) -> usize {
        self.page_size
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        let batch = Arc::new(batch.clone());
        self.on_all_ranks(move |r| r.forward(&batch))
    }

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        let batch = Arc::new(batch.clone());
        self.on_all_ranks(move |r| r.forward_sample(&batch))
    }
}

/// Overlap scheduling (chapter 6.4) over every rank: each rank queues its part of the step and
/// answers at once, so the scheduler decides the next step while the GPUs compute this one.
/// Every rank samples the same tokens, so a pending decode input reads the same id on each.
impl QueuedRunner for TpCudaRunner {
    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        let batch = Arc::new(batch.clone());
        self.on_all_ranks(move |r| r.launch(&batch))
    }

    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        self.on_all_ranks(|r| r.collect())
    }
}

impl ChunkRunner for TpCudaRunner {
    /// Every rank copies (and turns) the K/V of its own heads.
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        let (src, dst) = (src.clone(), dst.clone());
        self.on_all_ranks(move |r| r.copy_kv(&src, &dst, rope_shift))
    }

    /// Every rank plans the same cascade groups: rank 0's count.
    fn cascade_stats(&self) -> CascadeStats {
        self.on_ranks(1, |r| Ok(r.cascade_stats()))
            .unwrap_or_default()
    }
}

/// The tensor-parallel CUDA runner the config asks for: `tensor_parallel_size` GPUs from
/// `cuda:device` on.
pub fn tp_cuda_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
    options: CudaOptions,
) -> Result<Runner<dyn ChunkRunner>, phase6::Error> {
    let tp = config.tensor_parallel_size;
    check_split(&model_config, tp).map_err(phase6::Error::InvalidConfig)?;
    let device = options.device;
    let runner = TpCudaRunner::new(&model_config, weights, options, tp)?;
    let nccl = nccl::version().unwrap_or_else(|e| format!("(version unknown: {e})"));
    let report = format!(
        "devices cuda:{device}..cuda:{}, tensor parallel over {tp} GPUs (NCCL {nccl}); each: {}",
        device + tp - 1,
        runner.memory_report()
    );
    Ok(Runner {
        runner: Box::new(runner),
        device: Device::Cuda(device),
        report,
    })
}
