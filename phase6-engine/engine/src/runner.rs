//! The CPU runner of chapter 2, sized for the engine: its KV pages from `num_kvcache_blocks`
//! or the byte budget `cpu_kv_cache_bytes`.

use phase1::{KvLayout, KvPool};
use phase2::{CpuRunner, Model, ModelConfig, Weights};

use crate::config::{Config, Device};
use crate::error::Error;

/// A runner ready to serve, where it runs, and a line saying what it took (printed at start).
pub struct Runner<R: ?Sized> {
    pub runner: Box<R>,
    pub device: Device,
    pub report: String,
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The model in the f32 form the CPU runs, with a line saying what it took when that was slow.
pub fn load_cpu_model(model_config: ModelConfig, weights: &Weights) -> Result<Model, Error> {
    let start = std::time::Instant::now();
    let model = Model::from_weights(model_config, weights)?;
    let secs = start.elapsed().as_secs_f64();
    if secs > 1.0 {
        let how = match weights.random_seed() {
            Some(seed) => format!("generated (random, seed {seed})"),
            None => "loaded".to_string(),
        };
        eprintln!(
            "weights: {:.2} GiB {how} and widened to f32 in {secs:.1} s",
            weights.total_bytes() as f64 / (1u64 << 30) as f64
        );
    }
    Ok(model)
}

/// Pages of the config's size for a K/V of `layout`: `num_kvcache_blocks`, or as many as the
/// byte budget `cpu_kv_cache_bytes` holds. A budget that holds none is an error.
pub fn cpu_kv_pages(layout: &KvLayout, config: &Config) -> Result<usize, Error> {
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
    Ok(pages)
}

/// The CPU runner with its KV pages sized from `num_kvcache_blocks` or the byte budget.
pub fn cpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<CpuRunner>, Error> {
    let model = load_cpu_model(model_config, weights)?;
    let layout = CpuRunner::kv_layout_of(&model);
    let ps = config.kvcache_block_size;
    let pages = cpu_kv_pages(&layout, config)?;
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
