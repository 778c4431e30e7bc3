//! Tensor parallelism against one rank, token by token: one model run greedily at
//! `tensor_parallel_size` 1 and at N on the same prompts, compared step by step.
//!
//! `cargo run --release -p nanoserve --features cuda --example tp_tokens -- --device cuda
//! --config configs/qwen3-8b.json --tp 2` (random weights; `--device cpu` runs the ranks as
//! threads, `--prompts 16 --steps 64` are the defaults).
//!
//! One rank runs every prompt (16 to 2,000 tokens, spread geometrically) for `--steps` greedy
//! tokens; N ranks then read the same tokens (teacher forcing), so their logits answer the same
//! question at every step. Printed per prompt: the first step's logit error (bf16 rounding in
//! a different order of additions), as its largest element over the largest logit and as
//! `‖error‖ / ‖logits‖`; how many leading steps have a top-2 margin of at least `--margin` (0.5)
//! in the one-rank logits, the steps where rounding should not reorder the top two; how many
//! greedy tokens the N ranks share with one rank before they first differ, which must reach the
//! first of them; and, over all steps, on how many wide-margin steps both pick the same token,
//! which must be all. Exits with 1 when a token check fails.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use nanoserve::runners::build_runner;
use phase0::TokenId;
use phase2::sampler::top2_gap;
use phase2::{ModelConfig, Weights};
use phase6::{Config, Device};
use phase6_fp8::measure::{Sequences, argmax, common_prefix, rel_error};

/// The comparison's options.
#[derive(Parser)]
struct Args {
    /// The architecture, run with random weights.
    #[arg(long, default_value = "configs/qwen3-0.6b.json")]
    config: PathBuf,
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Ranks compared with one.
    #[arg(long, default_value_t = 2)]
    tp: usize,
    #[arg(long, default_value_t = 16)]
    prompts: usize,
    /// Greedy steps after each prompt.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// The top-2 margin at which rounding should not reorder the top two.
    #[arg(long, default_value_t = 0.5)]
    margin: f32,
}

/// `n` prompt lengths from `shortest` to `longest`, evenly spread on a log scale.
fn lengths(n: usize, shortest: usize, longest: usize) -> Vec<usize> {
    let ratio = longest as f64 / shortest as f64;
    (0..n)
        .map(|i| {
            let f = if n > 1 {
                i as f64 / (n - 1) as f64
            } else {
                0.0
            };
            (shortest as f64 * ratio.powf(f)).round() as usize
        })
        .collect()
}

/// A prompt of `len` token ids drawn from `vocab` by a fixed linear congruential sequence.
fn prompt(len: usize, vocab: usize, seed: u64) -> Vec<TokenId> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as TokenId
        })
        .collect()
}

/// `max |a - b| / max |b|`.
fn error_of_scale(a: &[f32], b: &[f32]) -> f32 {
    let err = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    err / b.iter().fold(0.0f32, |m, y| m.max(y.abs()))
}

/// `[step][prompt]`: a prompt's logits after a step.
type StepLogits = Vec<Vec<Vec<f32>>>;

/// Every prompt's logits at every step (`[step][prompt]`), reading `tokens[prompt][step]` after
/// the prompt, or (with `tokens` empty) each step's own greedy choice.
fn run(
    model: &ModelConfig,
    weights: &Weights,
    config: &Config,
    prompts: &[Vec<TokenId>],
    tokens: &[Vec<TokenId>],
    steps: usize,
) -> Result<StepLogits, phase6::Error> {
    let start = Instant::now();
    let mut runner = build_runner(model.clone(), weights, config)?;
    eprintln!(
        "tp {}: {} (ready in {:.1} s)",
        config.tensor_parallel_size,
        runner.report,
        start.elapsed().as_secs_f64()
    );
    let mut seqs = Sequences::new(&mut *runner.runner, prompts.len())?;
    let mut out: StepLogits = Vec::with_capacity(steps);
    let mut next = prompts.to_vec();
    let start = Instant::now();
    for step in 0..steps {
        let rows = seqs.step(&next)?;
        next = (0..prompts.len())
            .map(|i| match tokens.get(i) {
                Some(forced) => vec![forced[step]],
                None => vec![argmax(&rows[i])],
            })
            .collect();
        out.push(rows);
    }
    eprintln!(
        "tp {}: {steps} steps in {:.2} s",
        config.tensor_parallel_size,
        start.elapsed().as_secs_f64()
    );
    Ok(out)
}

fn main() -> Result<(), phase6::Error> {
    let args = Args::parse();
    let (path, tp, n, steps, wide) = (args.config, args.tp, args.prompts, args.steps, args.margin);
    let device: Device = args.device.parse()?;
    let model = ModelConfig::from_file(&path)?;
    let weights = Weights::random(&model, 0);
    let prompts: Vec<Vec<TokenId>> = lengths(n, 16, 2000)
        .into_iter()
        .enumerate()
        .map(|(i, len)| prompt(len, model.vocab_size, i as u64))
        .collect();
    let total: usize = prompts.iter().map(Vec::len).sum();
    let pages = prompts
        .iter()
        .map(|p| (p.len() + steps).div_ceil(16))
        .sum::<usize>();
    let config = |tensor_parallel_size| Config {
        device,
        tensor_parallel_size,
        kvcache_block_size: 16,
        num_kvcache_blocks: pages as i64,
        cpu_kv_cache_bytes: 4 << 30,
        max_num_batched_tokens: total.max(16384),
        max_num_seqs: n,
        max_model_len: 2000 + steps,
        ..Config::default()
    };
    let one = run(&model, &weights, &config(1), &prompts, &[], steps)?;
    let chosen: Vec<Vec<TokenId>> = (0..n)
        .map(|i| one.iter().map(|rows| argmax(&rows[i])).collect())
        .collect();
    let many = run(&model, &weights, &config(tp), &prompts, &chosen, steps)?;

    println!(
        "{} with random weights, tensor_parallel_size {tp} against 1, {steps} greedy steps\n",
        path.display()
    );
    println!(
        "| prompt tokens | first step: largest error / largest logit | first step: ‖error‖ / ‖logits‖ | leading steps with margin >= {wide} | tokens shared before the first difference | wide-margin steps alike |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let (mut misses, mut wide_steps, mut wide_alike, mut over) = (0, 0, 0, 0);
    let mut norm_worst = 0.0f32;
    for (i, p) in prompts.iter().enumerate() {
        let err = error_of_scale(&many[0][i], &one[0][i]);
        let norm = rel_error(&many[0][i], &one[0][i]);
        norm_worst = norm_worst.max(norm);
        over += usize::from(err > 0.02);
        let margins: Vec<f32> = one.iter().map(|rows| top2_gap(&rows[i])).collect();
        let leading = margins.iter().take_while(|&&m| m >= wide).count();
        let theirs: Vec<TokenId> = many.iter().map(|rows| argmax(&rows[i])).collect();
        let shared = common_prefix(&theirs, &chosen[i]);
        let (w, alike) = margins
            .iter()
            .zip(theirs.iter().zip(&chosen[i]))
            .filter(|(m, _)| **m >= wide)
            .fold((0, 0), |(w, a), (_, (x, y))| {
                (w + 1, a + usize::from(x == y))
            });
        wide_steps += w;
        wide_alike += alike;
        let ok = shared >= leading && alike == w;
        misses += usize::from(!ok);
        println!(
            "| {} | {:.3}% | {:.3}% | {leading} | {shared} | {alike} of {w}{} |",
            p.len(),
            100.0 * err,
            100.0 * norm,
            if ok { "" } else { " **miss**" }
        );
    }
    println!(
        "\nWide-margin steps alike: {wide_alike} of {wide_steps}; prompts failing a token check: \
         {misses} of {n}. First step: largest error over 2% of the largest logit on {over} of {n} \
         prompts; ‖error‖ / ‖logits‖ at most {:.3}%.",
        100.0 * norm_worst
    );
    if misses > 0 {
        std::process::exit(1);
    }
    Ok(())
}
