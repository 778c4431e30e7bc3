//! What an FP8 K/V cache costs in accuracy, measured on the CPU: the FP8 runner against the
//! f32 runner on the embedded model, the fixture models and random-weight configurations.
//! Prints Markdown tables (the ones in book/ch06-6-fp8.md and BENCHMARKS.md):
//!
//! `cargo run -p phase6-fp8 --release --example accuracy` (about 15 minutes on 2 cores);
//! `-- --quick` measures a few short prompts of the embedded model only (seconds).
//!
//! For each runner with FP8 K/V, scales 1.0 and scales calibrated from the first prefill:
//! the relative error of the logits after a prompt, `‖fp8 − f32‖ / ‖f32‖`, and how many of
//! 64 greedy tokens match the f32 runner's before the first difference; on the embedded
//! model, the perplexity of the tokens it was not trained on.

use std::path::Path;
use std::time::Instant;

use phase0::TokenId;
use phase2::{CpuRunner, Fixture, Model, ModelConfig, ModelRunner, Tokenizer, Weights, models_dir};
use phase6_fp8::Fp8CpuRunner;
use phase6_fp8::measure::{common_prefix, greedy, perplexity, prefill_logits, rel_error};

const PAGE: usize = 16;
const GREEDY: usize = 64;
/// The embedded model was trained on the first 90 % of the corpus's tokens.
const TRAINED_FRACTION: f64 = 0.9;
const WINDOW: usize = 512;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The three runners compared, on one model with `pages` pages each.
fn runners(model: &Model, pages: usize) -> [Box<dyn ModelRunner>; 3] {
    [
        Box::new(CpuRunner::new(model.clone(), pages, PAGE)),
        Box::new(Fp8CpuRunner::new(model.clone(), pages, PAGE, false)),
        Box::new(Fp8CpuRunner::new(model.clone(), pages, PAGE, true)),
    ]
}

/// Mean and max over prompts, per FP8 mode: logit error and greedy tokens before the first
/// difference.
#[derive(Default)]
struct Row {
    errors: [Vec<f32>; 2],
    agree: [Vec<usize>; 2],
}

impl Row {
    fn cells(&self) -> String {
        let mut out = String::new();
        for m in 0..2 {
            let e = &self.errors[m];
            let mean = e.iter().sum::<f32>() / e.len() as f32;
            let max = e.iter().copied().fold(0.0, f32::max);
            let a = &self.agree[m];
            let agree_mean = a.iter().sum::<usize>() as f64 / a.len() as f64;
            let agree_min = a.iter().min().unwrap();
            out += &format!(" {mean:.1e} / {max:.1e} | {agree_mean:.1} / {agree_min} |");
        }
        out
    }
}

/// Every prompt on the three runners of `model` (fresh pages for each prompt).
fn compare(model: &Model, prompts: &[Vec<TokenId>]) -> Result<Row> {
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let pages = (longest + GREEDY).div_ceil(PAGE) + 1;
    let mut row = Row::default();
    for prompt in prompts {
        let [mut f32_runner, mut scale_one, mut calibrated] = runners(model, pages);
        let reference = prefill_logits(f32_runner.as_mut(), prompt)?;
        let tokens = greedy(f32_runner.as_mut(), prompt, GREEDY)?;
        for (m, runner) in [&mut scale_one, &mut calibrated].into_iter().enumerate() {
            let logits = prefill_logits(runner.as_mut(), prompt)?;
            row.errors[m].push(rel_error(&logits, &reference));
            let fp8_tokens = greedy(runner.as_mut(), prompt, GREEDY)?;
            row.agree[m].push(common_prefix(&fp8_tokens, &tokens));
        }
    }
    Ok(row)
}

fn header(first: &str) {
    println!(
        "| {first} | prompt tokens | prompts | logit error, scales 1.0 (mean / max) | greedy tokens equal of {GREEDY}, scales 1.0 (mean / min) | logit error, calibrated (mean / max) | greedy tokens equal of {GREEDY}, calibrated (mean / min) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
}

/// A prompt of `len` token ids drawn from a fixed sequence (for random-weight models).
fn random_prompt(len: usize, vocab: usize, seed: u64) -> Vec<TokenId> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = phase2::random_weights::mix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15));
            (x % vocab as u64) as TokenId
        })
        .collect()
}

fn embedded(held_out: &[TokenId], lens: &[usize]) -> Result<()> {
    let dir = phase2::default_model_dir();
    let model = Model::load(&dir)?;
    header("embedded model");
    for &len in lens {
        let starts = [0, 5000, 10000, 20000];
        let prompts: Vec<Vec<TokenId>> = starts
            .iter()
            .map(|&s| held_out[s..s + len].to_vec())
            .collect();
        let row = compare(&model, &prompts)?;
        println!(
            "| tiny-shakespeare | {len} | {} |{}",
            prompts.len(),
            row.cells()
        );
    }
    println!();
    Ok(())
}

fn fixtures() -> Result<()> {
    let dir = models_dir().join("fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::result::Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|x| x == "json"));
    files.sort();
    header("fixture model");
    for file in files {
        let fixture = Fixture::read(&file)?;
        let model = Model::load(&models_dir().join(&fixture.model_dir))?;
        // Room for the greedy tokens within the model's positions.
        let room = model.config.max_position_embeddings - GREEDY;
        let prompts: Vec<Vec<TokenId>> = fixture
            .cases
            .iter()
            .map(|c| c.prompt[..c.prompt.len().min(room)].to_vec())
            .collect();
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let row = compare(&model, &prompts)?;
        let name = file.file_stem().unwrap().to_string_lossy();
        println!(
            "| {name} | {} to {} | {} |{}",
            lens.iter().min().unwrap(),
            lens.iter().max().unwrap(),
            prompts.len(),
            row.cells()
        );
    }
    println!();
    Ok(())
}

fn random_weights() -> Result<()> {
    header("random weights");
    for (file, layers) in [("qwen3-0.6b.json", 2)] {
        let path = models_dir().join("../configs").join(file);
        let mut config = ModelConfig::from_file(&path)?;
        config.num_layers = layers;
        let weights = Weights::random(&config, 0);
        let model = Model::from_weights(config.clone(), &weights)?;
        for len in [128, 1024, 4096] {
            let prompt = random_prompt(len, config.vocab_size, len as u64);
            let row = compare(&model, &[prompt])?;
            let name = format!("{} ({layers} layers)", file.trim_end_matches(".json"));
            println!("| {name} | {len} | 1 |{}", row.cells());
        }
    }
    println!();
    Ok(())
}

fn held_out_perplexity(held_out: &[TokenId], windows: usize) -> Result<()> {
    let model = Model::load(&phase2::default_model_dir())?;
    let windows: Vec<&[TokenId]> = held_out.chunks_exact(WINDOW).take(windows).collect();
    let pages = windows.len() * WINDOW.div_ceil(PAGE);
    let names = [
        "f32 K/V",
        "FP8 K/V, scales 1.0",
        "FP8 K/V, calibrated scales",
    ];
    println!(
        "| embedded model, held-out text ({} windows of {WINDOW} tokens) | perplexity |",
        windows.len()
    );
    println!("| --- | --- |");
    for (name, mut runner) in names.into_iter().zip(runners(&model, pages)) {
        let ppl = perplexity(runner.as_mut(), &windows)?;
        println!("| {name} | {ppl:.4} |");
    }
    println!();
    Ok(())
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let corpus =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tinyshakespeare.txt");
    let text = std::fs::read_to_string(&corpus)
        .map_err(|e| format!("{}: {e} (the tiny Shakespeare corpus)", corpus.display()))?;
    let tokenizer = Tokenizer::from_dir(&phase2::default_model_dir())?;
    let ids = tokenizer.encode(&text)?;
    let split = (ids.len() as f64 * TRAINED_FRACTION) as usize;
    let held_out = &ids[split..];
    eprintln!(
        "corpus: {} tokens, the last {} held out (the model trained on the first {split})",
        ids.len(),
        held_out.len()
    );
    let start = Instant::now();
    if quick {
        embedded(held_out, &[16, 64])?;
        return held_out_perplexity(held_out, 2);
    }
    embedded(held_out, &[16, 128, 512, 1984])?;
    eprintln!("embedded: {:.0} s", start.elapsed().as_secs_f64());
    fixtures()?;
    eprintln!("fixtures: {:.0} s", start.elapsed().as_secs_f64());
    random_weights()?;
    eprintln!("random weights: {:.0} s", start.elapsed().as_secs_f64());
    held_out_perplexity(held_out, usize::MAX)?;
    eprintln!("perplexity: {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}
