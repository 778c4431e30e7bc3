//! Time to first token with a registered 1,000-token context against recomputing it, on the
//! embedded model (CPU). The reference target for the chunk API is more than 10x.
//!
//! `cargo run --release -p phase6 --example chunk_ttft`

use std::collections::BTreeMap;
use std::time::Instant;

use phase6::{ChunkConfig, ChunkType, ChunkedLLM, Config, Device, LLM, Prompt, SamplingParams};

const CORPUS: &str = include_str!("../../models/tiny-shakespeare/README.md");

fn config() -> Config {
    Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 256 << 20,
        enable_prefix_caching: false,
        seed: Some(0),
        ..Config::default()
    }
}

fn main() -> Result<(), phase6::Error> {
    let dir = phase6::default_model_dir();
    let mut chunks = ChunkedLLM::new(
        &dir,
        ChunkConfig {
            engine: config(),
            ..ChunkConfig::default()
        },
    )?;
    let tok = phase2::Tokenizer::from_dir(&dir)?;
    // About 1,000 tokens of context: the model card's text, repeated as needed.
    let mut context = String::new();
    while tok.encode(&context)?.len() < 1000 {
        context.push_str(CORPUS);
    }
    let ids = tok.encode(&context)?;
    let context = tok.decode(&ids[..1000], false)?;
    let system = "You answer questions about the document below.\n";
    let query = "\nQUESTION: What is the model trained on?\nANSWER:";

    let sys = chunks.register_chunk(system, ChunkType::SystemPrompt, BTreeMap::new())?;
    let ctx = chunks.register_chunk(&context, ChunkType::Context, BTreeMap::new())?;
    let q = chunks.register_chunk(query, ChunkType::Query, BTreeMap::new())?;
    let first_token = SamplingParams::greedy().with_max_tokens(1);
    // The first composition computes the context after the system prompt once.
    let t = Instant::now();
    let first = chunks.generate_from_chunks(&sys, &[&ctx], &q, first_token.clone())?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut cached_ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        chunks.generate_from_chunks(&sys, &[&ctx], &q, first_token.clone())?;
        cached_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // Recomputing: plain generation of the same tokens, prefix cache off.
    let mut llm = LLM::new(&dir, config())?;
    let mut all = tok.encode(system)?;
    all.extend(tok.encode(&context)?);
    all.extend(tok.encode(query)?);
    let mut recompute_ms = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        llm.generate(&[Prompt::Tokens(all.clone())], first_token.clone(), false)?;
        recompute_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (cached, recompute) = (median(&mut cached_ms), median(&mut recompute_ms));
    println!(
        "prompt: {} tokens ({} of them in the registered context)",
        first.prompt_tokens, 1000
    );
    println!("| | time to first token |");
    println!("| --- | --- |");
    println!("| recompute the whole prompt | {recompute:.1} ms |");
    println!("| first composition (computes the context chain once) | {first_ms:.1} ms |");
    println!("| registered chunks, chain cached | {cached:.1} ms |");
    println!("speed-up: {:.1}x", recompute / cached);
    Ok(())
}
