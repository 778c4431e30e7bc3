//! `nanoserve`: the command line of the engine.
//!
//! `generate` streams completions, `chat` is an interactive conversation, `serve` is an
//! OpenAI-compatible HTTP server, `bench` runs the nano-vllm throughput workload, `report`
//! runs the phase-by-phase comparison. Every command takes the same model and engine options;
//! the default model is the embedded tiny Shakespeare model, so everything works on a fresh
//! machine with no network.

mod bench;
pub mod chat;
mod generate;
mod report;
mod serve;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use phase2::{GenerationConfig, ModelConfig, Tokenizer, Weights};

use phase6::Error;
use phase6::{Config, Device, KvCacheDtype};
use phase6_chunks::ChunkLLM;

use crate::runners::start_llm;

#[derive(Debug, Parser)]
#[command(
    name = "nanoserve",
    version,
    about = "nano-serving: an LLM serving engine built as a course"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate completions for prompts, streaming the text as it is produced
    Generate(generate::GenerateArgs),
    /// Chat with the model (type /help for commands)
    Chat(chat::ChatArgs),
    /// Serve the model over HTTP with the OpenAI API (/v1/completions, /v1/chat/completions)
    Serve(serve::ServeArgs),
    /// Measure throughput on the nano-vllm workload (random prompts and output lengths)
    Bench(bench::BenchArgs),
    /// Serve one workload five ways (chapter by chapter) and write a Markdown report with plots
    Report(report::ReportArgs),
}

/// The model and engine options every command takes.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// Hugging Face model folder (config.json, *.safetensors, tokenizer.json) [default: the
    /// embedded tiny Shakespeare model]
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Use random weights for the architecture in --config (benchmarks without a checkpoint)
    #[arg(long, requires = "config")]
    pub random_weights: bool,
    /// A config.json giving the architecture for --random-weights
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// auto, cpu, cuda or cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Ranks the model is split over (Megatron-style tensor parallelism): threads on the CPU, or
    /// one GPU each from the --device on, NCCL between them
    #[arg(long, default_value_t = 1)]
    pub tensor_parallel_size: usize,
    #[arg(long, default_value_t = 4096)]
    pub max_model_len: usize,
    #[arg(long, default_value_t = 512)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = 16384)]
    pub max_num_batched_tokens: usize,
    /// Tokens per KV page (a multiple of 16)
    #[arg(long, default_value_t = 256)]
    pub kvcache_block_size: usize,
    /// KV pages to allocate (-1: size from memory)
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub num_kvcache_blocks: i64,
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f32,
    /// KV memory on the CPU, in MiB
    #[arg(long, default_value_t = 1024)]
    pub cpu_kv_cache_mib: usize,
    /// How K/V is stored: auto (f32 on the CPU, bf16 on a GPU), or fp8 / fp8_e4m3 (8-bit
    /// floats with per-layer scales: half the bytes a token on a GPU)
    #[arg(long, default_value = "auto")]
    pub kv_cache_dtype: String,
    /// Most prompt tokens per request per step (0: whole prompts)
    #[arg(long, default_value_t = 2048)]
    pub chunked_prefill_size: usize,
    /// Turn the radix prefix cache off
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Decode without CUDA graphs
    #[arg(long)]
    pub enforce_eager: bool,
    /// Run one step at a time: no deciding the next decode step while one runs on the GPU
    #[arg(long)]
    pub no_overlap: bool,
    /// Seed for requests that bring none (default: random)
    #[arg(long)]
    pub engine_seed: Option<u64>,
}

impl ModelArgs {
    pub fn engine_config(&self) -> Result<Config, Error> {
        Ok(Config {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            max_model_len: self.max_model_len,
            gpu_memory_utilization: self.gpu_memory_utilization,
            tensor_parallel_size: self.tensor_parallel_size,
            enforce_eager: self.enforce_eager,
            overlap_scheduling: !self.no_overlap,
            kvcache_block_size: self.kvcache_block_size,
            num_kvcache_blocks: self.num_kvcache_blocks,
            device: self.device.parse::<Device>()?,
            cpu_kv_cache_bytes: self.cpu_kv_cache_mib << 20,
            kv_cache_dtype: self.kv_cache_dtype.parse::<KvCacheDtype>()?,
            chunked_prefill_size: (self.chunked_prefill_size > 0)
                .then_some(self.chunked_prefill_size),
            enable_prefix_caching: !self.no_prefix_caching,
            seed: self.engine_seed,
        })
    }

    pub fn model_dir(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(phase2::default_model_dir)
    }

    /// The model's config, its weights (loaded or random) and its tokenizer if it has one.
    pub fn load_parts(&self) -> Result<(ModelConfig, Weights, Option<Tokenizer>, String), Error> {
        if self.random_weights {
            let path = self.config.clone().expect("clap requires --config");
            let config = ModelConfig::from_file(&path)?;
            let weights = Weights::random(&config, 0);
            let name = format!("{} with random weights", path.display());
            return Ok((config, weights, None, name));
        }
        let dir = self.model_dir();
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(&dir)?;
        let tokenizer = Tokenizer::from_dir(&dir)?;
        Ok((config, weights, Some(tokenizer), dir.display().to_string()))
    }

    /// Starts the engine, with the model's generation config, and prints what it took.
    pub fn load(&self) -> Result<ChunkLLM, Error> {
        let (config, weights, tokenizer, name) = self.load_parts()?;
        let mut llm = start_llm(config, &weights, tokenizer, self.engine_config()?)?;
        if !self.random_weights {
            llm.set_generation_config(GenerationConfig::from_dir(&self.model_dir())?);
        }
        eprintln!("model {name}\n{}", llm.startup_report());
        Ok(llm)
    }
}

/// The command line's own sampling defaults, for what neither the command line nor the model's
/// `generation_config.json` sets.
const TEMPERATURE: f32 = 0.8;
const MAX_TOKENS: usize = 128;

/// Sampling options shared by `generate` and `chat`. An option left out takes the model's
/// `generation_config.json` value, else the default shown.
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Most tokens to generate [default: 128, or the model's max_new_tokens if smaller]
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// 0 is greedy [default: the model's, else 0.8]
    #[arg(long)]
    pub temperature: Option<f32>,
    /// [default: the model's, else 1.0]
    #[arg(long)]
    pub top_p: Option<f32>,
    /// -1 disables top-k [default: the model's, else -1]
    #[arg(long, allow_hyphen_values = true)]
    pub top_k: Option<i32>,
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The params of these options over the model's defaults.
    pub fn params(&self, model: &GenerationConfig) -> phase0::SamplingParams {
        let defaults = model.default_sampling_params();
        phase0::SamplingParams {
            temperature: self
                .temperature
                .or(model.temperature)
                .unwrap_or(TEMPERATURE),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            max_tokens: self
                .max_tokens
                .unwrap_or(model.default_max_tokens(MAX_TOKENS)),
            ignore_eos: self.ignore_eos,
            seed: self.seed,
            ..defaults
        }
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), Error> {
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Report(args) => report::run(args),
    }
}
