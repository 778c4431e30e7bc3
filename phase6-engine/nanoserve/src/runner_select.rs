//! Choosing and sizing the model runner: the CPU runner, or the CUDA runner when the build has
//! the `cuda` feature and the config asks for a GPU (or `auto` finds one).

use phase1::KvPool;
use phase2::{CpuRunner, Model, ModelConfig, ModelRunner, Weights};

use crate::config::{Config, Device};
use crate::error::Error;

/// A runner ready to serve, and a line saying what it took (printed at start).
pub struct Runner {
    pub runner: Box<dyn ModelRunner>,
    pub device: Device,
    pub report: String,
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The CPU runner with its KV pages sized from `num_kvcache_blocks` or the byte budget.
pub fn cpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner, Error> {
    let model = Model::from_weights(model_config, weights)?;
    let layout = CpuRunner::kv_layout_of(&model);
    let ps = config.kvcache_block_size;
    let pages = if config.num_kvcache_blocks > 0 {
        config.num_kvcache_blocks as usize
    } else {
        layout.pages_in_budget(config.cpu_kv_cache_bytes, ps)
    };
    if pages == 0 {
        return Err(Error::OutOfMemory(format!(
            "a KV budget of {} bytes holds no page of {} bytes",
            config.cpu_kv_cache_bytes,
            layout.page_bytes(ps)
        )));
    }
    // The pool refuses impossible shapes before any memory is taken.
    KvPool::new(pages, ps).map_err(phase2::Error::from)?;
    let report = format!(
        "device cpu: KV cache of {pages} pages x {ps} tokens = {} tokens, {:.1} MiB (f32)",
        pages * ps,
        mib(pages * layout.page_bytes(ps))
    );
    Ok(Runner {
        runner: Box::new(CpuRunner::new(model, pages, ps)),
        device: Device::Cpu,
        report,
    })
}

/// The runner the config asks for.
pub fn build_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner, Error> {
    match config.device {
        Device::Cpu => cpu_runner(model_config, weights, config),
        Device::Auto => match gpu_runner(model_config.clone(), weights, config, 0) {
            Ok(runner) => Ok(runner),
            Err(Error::Cuda(_)) => cpu_runner(model_config, weights, config),
            Err(e) => Err(e),
        },
        Device::Cuda(n) => gpu_runner(model_config, weights, config, n),
    }
}

#[cfg(not(feature = "cuda"))]
fn gpu_runner(_: ModelConfig, _: &Weights, _: &Config, n: usize) -> Result<Runner, Error> {
    Err(Error::Cuda(format!(
        "cuda:{n} asked for, but this build has no CUDA support (build with `--features cuda`)"
    )))
}

/// The CUDA runner on device `n`, its KV cache sized by `gpu_memory_utilization` unless the
/// config fixes the page count.
#[cfg(feature = "cuda")]
fn gpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
    n: usize,
) -> Result<Runner, Error> {
    let options = crate::CudaOptions {
        device: n,
        page_size: config.kvcache_block_size,
        gpu_memory_utilization: config.gpu_memory_utilization,
        num_pages: (config.num_kvcache_blocks > 0).then_some(config.num_kvcache_blocks as usize),
        max_num_batched_tokens: config.max_num_batched_tokens,
        max_num_seqs: config.max_num_seqs,
        enforce_eager: config.enforce_eager,
        tune_gemms: config.tune_gemms,
        ..crate::CudaOptions::default()
    };
    let runner = crate::CudaRunner::new(&model_config, weights, options)?;
    let report = format!("device cuda:{n}: {}", runner.memory_report());
    Ok(Runner {
        runner: Box::new(runner),
        device: Device::Cuda(n),
        report,
    })
}
