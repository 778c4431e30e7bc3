//! Time to first token with a registered context against recomputing it. The reference
//! target for the chunk API is more than 10x.
//!
//! `cargo run --release -p nanoserve --example chunk_ttft` (embedded model, CPU, 1,000 tokens);
//! on a GPU: `... --features cuda --example chunk_ttft -- --device cuda
//! --config configs/qwen3-0.6b.json --contexts 1000,4000,16000` (random weights).
//! `--mode independent` composes in independent mode (each context prefilled once at position 0,
//! its K/V copied behind the system prompt with its keys turned) instead of exact.

use std::collections::BTreeMap;
use std::time::Instant;

use nanoserve::runners::start_llm;
use phase6::{Config, Device, Prompt, SamplingParams};
use phase6_chunks::{ChunkConfig, ChunkType, ChunkedLLM, CompositionMode};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), phase6::Error> {
    let device: Device = arg("--device").unwrap_or_else(|| "cpu".into()).parse()?;
    let contexts: Vec<usize> = arg("--contexts")
        .unwrap_or_else(|| "1000".into())
        .split(',')
        .map(|s| s.parse().expect("--contexts takes numbers"))
        .collect();
    let mode = match arg("--mode").as_deref() {
        None | Some("exact") => CompositionMode::Exact,
        Some("independent") => CompositionMode::Independent,
        Some(other) => panic!("--mode {other}: use exact or independent"),
    };
    let longest = contexts.iter().max().copied().unwrap_or(1000);
    let config = Config {
        device,
        kvcache_block_size: if device == Device::Cpu { 16 } else { 256 },
        cpu_kv_cache_bytes: 256 << 20,
        max_model_len: longest + 256,
        max_num_batched_tokens: (longest + 256).max(16384),
        enable_prefix_caching: false,
        seed: Some(0),
        ..Config::default()
    };
    // The model: a config with random weights, or the embedded model.
    let (model_config, weights, tokenizer_dir) = match arg("--config") {
        Some(path) => {
            let c = phase2::ModelConfig::from_file(std::path::Path::new(&path))?;
            let w = phase2::Weights::random(&c, 0);
            (c, w, None)
        }
        None => {
            let dir = phase6::default_model_dir();
            let c = phase2::ModelConfig::from_file(&dir.join("config.json"))?;
            (c, phase2::Weights::open(&dir)?, Some(dir))
        }
    };
    let tokenizer = || {
        tokenizer_dir
            .as_deref()
            .map(phase2::Tokenizer::from_dir)
            .transpose()
    };
    let vocab = model_config.vocab_size.min(10_000) as u32;
    let ids = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7919 + salt * 104_729) % vocab)
            .collect()
    };
    // Two engines share the device: the chunk engine takes under half of its memory and the
    // recomputing one what is left.
    let chunk_config = Config {
        gpu_memory_utilization: 0.45,
        ..config.clone()
    };
    let llm = start_llm(model_config.clone(), &weights, tokenizer()?, chunk_config)?;
    eprintln!("{}", llm.startup_report());
    let mut chunks = ChunkedLLM::from_llm(
        llm,
        ChunkConfig {
            chunk_memory_ratio: 0.9,
            mode,
            ..ChunkConfig::default()
        },
    )?;
    let mut plain = start_llm(model_config, &weights, tokenizer()?, config)?;
    drop(weights);
    let first_token = SamplingParams::greedy().with_max_tokens(1);

    println!(
        "| context tokens | recompute the prompt | first composition | registered, chain cached | speed-up |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (k, &n) in contexts.iter().enumerate() {
        let system = ids(40, 1);
        let context = ids(n, 2 + k as u32);
        let query = ids(16, 3);
        let none = BTreeMap::new;
        let sys = chunks.register_chunk_tokens(&system, ChunkType::SystemPrompt, none())?;
        let ctx = chunks.register_chunk_tokens(&context, ChunkType::Context, none())?;
        let q = chunks.register_chunk_tokens(&query, ChunkType::Query, none())?;
        let t = Instant::now();
        chunks.generate_from_chunks(&sys, &[&ctx], &q, first_token.clone())?;
        let first_ms = t.elapsed().as_secs_f64() * 1e3;
        let cached: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                chunks
                    .generate_from_chunks(&sys, &[&ctx], &q, first_token.clone())
                    .map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_, _>>()?;
        let all: Vec<u32> = [system, context, query].concat();
        let recompute: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                plain
                    .generate(&[Prompt::Tokens(all.clone())], first_token.clone(), false)
                    .map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_, _>>()?;
        let (cached, recompute) = (median(cached), median(recompute));
        println!(
            "| {n} | {recompute:.1} ms | {first_ms:.1} ms | {cached:.1} ms | {:.1}x |",
            recompute / cached
        );
        chunks.clear_chunks(None);
    }
    Ok(())
}
