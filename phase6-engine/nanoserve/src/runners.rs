//! Picking the runner: the CPU chunk runner, the tensor-parallel CPU runner when the config asks
//! for more than one rank, the FP8 CPU runner when it asks for an FP8 K/V cache, or the CUDA
//! runner when this build has the `cuda` feature and the config asks for a GPU (or `auto` finds
//! one), with overlap scheduling; with more than one rank on GPUs, the tensor-parallel CUDA
//! runner (one GPU per rank, overlapped alike).

use phase2::{ModelConfig, Tokenizer, Weights};
use phase6::{Config, Device, Error, KvCacheDtype, LLM, Runner};
use phase6_chunks::{ChunkLLM, ChunkRunner, chunk_cpu_runner};
use phase6_fp8::fp8_cpu_runner;
use phase6_tp::tp_cpu_runner;

/// The runner the config asks for.
pub fn build_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<dyn ChunkRunner>, Error> {
    if config.kv_cache_dtype == KvCacheDtype::Fp8E4m3 {
        return fp8_runner(model_config, weights, config);
    }
    if config.tensor_parallel_size > 1 {
        return match config.device {
            Device::Cpu => tp_cpu_runner(model_config, weights, config),
            Device::Auto if gpu_present() => gpu_runner(model_config, weights, config, 0),
            Device::Auto => tp_cpu_runner(model_config, weights, config),
            Device::Cuda(n) => gpu_runner(model_config, weights, config, n),
        };
    }
    match config.device {
        Device::Cpu => chunk_cpu_runner(model_config, weights, config),
        Device::Auto if gpu_present() => gpu_runner(model_config, weights, config, 0),
        Device::Auto => chunk_cpu_runner(model_config, weights, config),
        Device::Cuda(n) => gpu_runner(model_config, weights, config, n),
    }
}

/// The FP8 K/V cache: on a GPU, the CUDA runner with FP8 buffers; on the CPU, chapter 6.6's
/// reference runner. One rank: tensor parallelism with FP8 is not built.
fn fp8_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<dyn ChunkRunner>, Error> {
    let dtype = config.kv_cache_dtype;
    if config.tensor_parallel_size > 1 {
        return Err(Error::InvalidConfig(format!(
            "kv_cache_dtype {dtype} with tensor_parallel_size = {}: the FP8 runner runs one \
             rank; ask for one or the other",
            config.tensor_parallel_size
        )));
    }
    match config.device {
        Device::Cpu => fp8_cpu_runner(model_config, weights, config),
        Device::Auto if gpu_present() => gpu_runner(model_config, weights, config, 0),
        Device::Auto => fp8_cpu_runner(model_config, weights, config),
        Device::Cuda(n) => gpu_runner(model_config, weights, config, n),
    }
}

/// The engine on the runner the config asks for; on a GPU, steps are decided ahead while the
/// device runs the one before (`overlap_scheduling`).
pub fn start_llm(
    model_config: ModelConfig,
    weights: &Weights,
    tokenizer: Option<Tokenizer>,
    config: Config,
) -> Result<ChunkLLM, Error> {
    // What the model needs of the config is checked before its weights are loaded.
    config.validate()?;
    config.validate_for(&model_config)?;
    let runner = build_runner(model_config.clone(), weights, &config)?;
    let overlap = config.overlap_scheduling && matches!(runner.device, Device::Cuda(_));
    let ranks = config.tensor_parallel_size;
    let mut llm = LLM::from_runner(runner, model_config, tokenizer, config)?;
    if overlap {
        install_overlap(&mut llm, ranks);
    }
    Ok(llm)
}

/// True if this build can use a GPU and the machine has one: `auto` then means the GPU, and a
/// GPU that cannot run what is asked (an FP8 cache on an older GPU, too few GPUs, no NCCL) is
/// an error, not a quiet fall back to the much slower CPU.
#[cfg(feature = "cuda")]
fn gpu_present() -> bool {
    phase6_cuda::device_count().is_ok_and(|n| n > 0)
}

#[cfg(not(feature = "cuda"))]
fn gpu_present() -> bool {
    false
}

#[cfg(not(feature = "cuda"))]
fn install_overlap(_: &mut ChunkLLM, _: usize) {}

#[cfg(feature = "cuda")]
fn install_overlap(llm: &mut ChunkLLM, ranks: usize) {
    use phase6_cuda::{CudaRunner, OverlapDriver};
    use phase6_tp::cuda::TpCudaRunner;
    match ranks {
        1 => llm.set_driver(Box::new(OverlapDriver::<CudaRunner>::new(true))),
        _ => llm.set_driver(Box::new(OverlapDriver::<TpCudaRunner>::new(true))),
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_runner(
    _: ModelConfig,
    _: &Weights,
    _: &Config,
    n: usize,
) -> Result<Runner<dyn ChunkRunner>, Error> {
    Err(Error::Cuda(format!(
        "cuda:{n} asked for, but this build has no CUDA support (build with `--features cuda`)"
    )))
}

/// The CUDA runner on device `n` (or, with `tensor_parallel_size` ranks, on devices `n..n + tp`),
/// its KV cache sized by `gpu_memory_utilization` unless the config fixes the page count.
#[cfg(feature = "cuda")]
fn gpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
    n: usize,
) -> Result<Runner<dyn ChunkRunner>, Error> {
    use phase6_cuda::{CudaOptions, CudaRunner};
    let options = CudaOptions {
        device: n,
        page_size: config.kvcache_block_size,
        gpu_memory_utilization: config.gpu_memory_utilization,
        num_pages: (config.num_kvcache_blocks > 0).then_some(config.num_kvcache_blocks as usize),
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_num_seqs: config.max_num_seqs,
        enforce_eager: config.enforce_eager,
        kv_cache_dtype: match config.kv_cache_dtype {
            KvCacheDtype::Auto => phase1::KvDtype::BF16,
            KvCacheDtype::Fp8E4m3 => phase1::KvDtype::Fp8E4m3,
        },
        ..CudaOptions::default()
    };
    if config.tensor_parallel_size > 1 {
        // Started again with NCCL on the loader's path if it must be (see `nccl`).
        phase6_tp::cuda::nccl::ensure_loadable(true).map_err(Error::Cuda)?;
        return phase6_tp::cuda::tp_cuda_runner(model_config, weights, config, options);
    }
    let runner = CudaRunner::new(&model_config, weights, options)?;
    let report = format!("device cuda:{n}: {}", runner.memory_report());
    Ok(Runner {
        runner: Box::new(runner),
        device: Device::Cuda(n),
        report,
    })
}
