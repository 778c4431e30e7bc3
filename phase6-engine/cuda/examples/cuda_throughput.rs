//! Offline throughput of the CUDA runner on nano-vllm's benchmark workload: Qwen3-0.6B's shape
//! with random weights, 256 requests with prompts of 100..=1024 random tokens and 100..=1024
//! output tokens each (EOS ignored), sampled at temperature 0.6, all queued at once and run
//! through the chapter 5 engine.
//!
//!     cargo run -p phase6 --features cuda --release --example cuda_throughput -- [--eager | --both]
//!         [--repeat N] [--seqs N] [--config configs/qwen3-0.6b.json]
//!
//! `--both` runs with CUDA graphs, then eagerly; `--repeat N` runs the whole sequence N times
//! (the same workload and weights) to show how much the numbers move between runs.
//!
//! Pages of 256 tokens, as nano-vllm uses: with the prefix cache off, the only cost of big
//! pages is less than one page per sequence left unfilled (256 of about 600k tokens of cache),
//! while decode reads fewer, longer runs of K/V and its page tables stay short. Prompts are
//! never chunked (the chunk is the whole step budget), as in nano-vllm.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use phase0::{SamplingParams, TokenId};
use phase2::{ModelConfig, Weights};
use phase5::{Batching, Engine, SchedulerConfig};
use phase6_cuda::{CudaOptions, CudaRunner};

const MAX_TOKENS_PER_STEP: usize = 16384;
const MAX_SEQS: usize = 512;
const PAGE_SIZE: usize = 256;

struct Args {
    /// `enforce_eager` of each run, in order.
    modes: Vec<bool>,
    repeat: usize,
    seqs: usize,
    config: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        modes: vec![false],
        repeat: 1,
        seqs: 256,
        config: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/qwen3-0.6b.json"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--eager" => args.modes = vec![true],
            "--both" => args.modes = vec![false, true],
            "--repeat" => {
                let v = it.next().ok_or("--repeat needs a number")?;
                args.repeat = v
                    .parse()
                    .map_err(|_| format!("--repeat {v}: not a number"))?;
            }
            "--seqs" => {
                let v = it.next().ok_or("--seqs needs a number")?;
                args.seqs = v.parse().map_err(|_| format!("--seqs {v}: not a number"))?;
            }
            "--config" => args.config = it.next().ok_or("--config needs a path")?.into(),
            other => {
                return Err(format!(
                    "unknown argument {other} (use --eager, --both, --repeat N, --seqs N, --config PATH)"
                ));
            }
        }
    }
    Ok(args)
}

/// SplitMix64: a fixed, seeded workload.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

struct Request {
    prompt: Vec<TokenId>,
    max_tokens: usize,
}

fn workload(seqs: usize) -> Vec<Request> {
    let mut rng = Rng(0);
    (0..seqs)
        .map(|_| {
            let len = rng.between(100, 1024);
            Request {
                prompt: (0..len)
                    .map(|_| rng.between(0, 10_000) as TokenId)
                    .collect(),
                max_tokens: rng.between(100, 1024),
            }
        })
        .collect()
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let args = parse_args()?;
    let config = ModelConfig::from_file(&args.config)?;
    let start = Instant::now();
    let weights = Weights::random(&config, 0);
    println!(
        "{}: {:.0}M parameters, random bf16 weights made in {:.1} s",
        args.config.display(),
        config.num_parameters() as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    let requests = workload(args.seqs);
    for _ in 0..args.repeat {
        for &eager in &args.modes {
            bench(&config, &weights, &requests, eager)?;
        }
    }
    Ok(())
}

fn bench(
    config: &ModelConfig,
    weights: &Weights,
    requests: &[Request],
    eager: bool,
) -> Result<(), Box<dyn Error>> {
    let mode = if eager { "eager" } else { "graphs" };
    let start = Instant::now();
    let options = CudaOptions {
        page_size: PAGE_SIZE,
        max_num_batched_tokens: MAX_TOKENS_PER_STEP,
        max_num_seqs: MAX_SEQS,
        enforce_eager: eager,
        ..CudaOptions::default()
    };
    let runner = CudaRunner::new(config, weights, options)?;
    println!(
        "[{mode}] runner ready in {:.1} s: {}",
        start.elapsed().as_secs_f64(),
        runner.memory_report()
    );
    let scheduler = SchedulerConfig {
        max_num_batched_tokens: MAX_TOKENS_PER_STEP,
        max_num_seqs: MAX_SEQS,
        chunk_size: Some(MAX_TOKENS_PER_STEP),
        enable_prefix_caching: false,
        batching: Batching::Continuous,
        max_model_len: 4096,
    };
    let mut engine = Engine::new(runner, scheduler, Vec::new(), 0)?;

    // Warm-up, untimed: one short request through prefill and decode.
    let warm = SamplingParams::default()
        .with_max_tokens(16)
        .with_ignore_eos(true);
    engine.add_request((1..=32).collect(), warm)?;
    engine.run_to_completion()?;

    for r in requests {
        let params = SamplingParams::default()
            .with_temperature(0.6)
            .with_max_tokens(r.max_tokens)
            .with_ignore_eos(true);
        engine.add_request(r.prompt.clone(), params)?;
    }
    let start = Instant::now();
    let (mut decode, mut mixed) = (Vec::new(), Vec::new());
    let mut output_tokens = 0;
    while !engine.is_finished() {
        let t = Instant::now();
        let step = engine.step()?;
        let took = t.elapsed();
        output_tokens += step.tokens.len();
        if step.num_prefill_tokens == 0 {
            decode.push((step.num_decode_tokens, took));
        } else {
            mixed.push((step.num_prefill_tokens + step.num_decode_tokens, took));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt.len()).sum();
    println!(
        "[{mode}] {} requests, {prompt_tokens} prompt + {output_tokens} output tokens in {elapsed:.2} s: {:.0} output tok/s, {:.0} total tok/s",
        requests.len(),
        output_tokens as f64 / elapsed,
        (prompt_tokens + output_tokens) as f64 / elapsed,
    );
    let widest = decode.iter().map(|&(n, _)| n).max().unwrap_or(0);
    let full: Vec<(usize, Duration)> = decode
        .iter()
        .copied()
        .filter(|&(n, _)| 2 * n >= widest)
        .collect();
    println!(
        "[{mode}] decode-only steps: {} (mean {}); at {}+ sequences: {} (mean {}); steps with prefill: {} (mean {})",
        decode.len(),
        mean(&decode),
        widest.div_ceil(2),
        full.len(),
        mean(&full),
        mixed.len(),
        mean(&mixed),
    );
    Ok(())
}

/// "x.xx ms per step at n sequences (tokens)".
fn mean(steps: &[(usize, Duration)]) -> String {
    if steps.is_empty() {
        return "-".into();
    }
    let time: Duration = steps.iter().map(|&(_, t)| t).sum();
    let tokens: usize = steps.iter().map(|&(n, _)| n).sum();
    format!(
        "{:.2} ms per step, {:.0} tokens per step",
        time.as_secs_f64() * 1e3 / steps.len() as f64,
        tokens as f64 / steps.len() as f64
    )
}
