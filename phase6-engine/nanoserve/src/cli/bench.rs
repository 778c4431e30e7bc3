//! `nanoserve bench`: nano-vllm's throughput workload, with latency percentiles, written as JSON.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use super::ModelArgs;
use crate::workload::{Percentiles, WorkloadSpec};
use phase6::Error;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 256)]
    pub num_seqs: usize,
    #[arg(long, default_value_t = 100)]
    pub min_input: usize,
    #[arg(long, default_value_t = 1024)]
    pub max_input: usize,
    #[arg(long, default_value_t = 100)]
    pub min_output: usize,
    #[arg(long, default_value_t = 1024)]
    pub max_output: usize,
    /// Seed of the workload (lengths, token ids, sampling)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sampling temperature of every request (nano-vllm's bench uses 0.6)
    #[arg(long, default_value_t = 0.6)]
    pub temperature: f32,
    /// Where to write the results
    #[arg(long, default_value = "bench.json")]
    pub json: PathBuf,
    /// Also write the workload (prompt ids and output lengths) as JSON, for other engines
    #[arg(long)]
    pub workload_out: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Debug, Serialize)]
struct BenchResult {
    model: String,
    device: String,
    startup: String,
    workload: WorkloadSpec,
    prompt_tokens: usize,
    output_tokens: usize,
    seconds: f64,
    output_tok_s: f64,
    total_tok_s: f64,
    ttft_ms: Percentiles,
    tpot_ms: Percentiles,
    steps: usize,
    decode_steps: usize,
    mean_decode_step_ms: f64,
    mean_decode_batch: f64,
    num_preemptions: u64,
}

pub fn run(args: BenchArgs) -> Result<(), Error> {
    let (config, weights, tokenizer, name) = args.model.load_parts()?;
    let mut llm =
        crate::runners::start_llm(config, &weights, tokenizer, args.model.engine_config()?)?;
    drop(weights);
    eprintln!("model {name}\n{}", llm.startup_report());
    let spec = WorkloadSpec {
        num_seqs: args.num_seqs,
        min_input: args.min_input,
        max_input: args.max_input,
        min_output: args.min_output,
        max_output: args.max_output,
        seed: args.seed,
        temperature: args.temperature,
    };
    let work = spec.build(llm.model_config().vocab_size);
    if let Some(path) = &args.workload_out {
        let requests: Vec<serde_json::Value> = work
            .iter()
            .map(|w| serde_json::json!({ "prompt_ids": w.prompt, "max_tokens": w.params.max_tokens }))
            .collect();
        let json = serde_json::json!({ "workload": spec, "requests": requests });
        std::fs::write(path, json.to_string())
            .map_err(|e| Error::Internal(format!("{}: {e}", path.display())))?;
    }

    // Warm up (kernel compilation, graph capture, caches) outside the timed run.
    llm.generate(
        &[phase6::Prompt::Tokens(vec![1; 16])],
        phase0::SamplingParams::greedy().with_max_tokens(4),
        false,
    )?;

    let start = Instant::now();
    for w in &work {
        llm.engine_mut()
            .add_request(w.prompt.clone(), w.params.clone())?;
    }
    let (mut ttft, mut tpot) = (Vec::new(), Vec::new());
    let (mut steps, mut decode_steps, mut decode_secs, mut decode_tokens) = (0, 0, 0.0, 0);
    let mut output_tokens = 0;
    while !llm.engine().is_finished() {
        let t = Instant::now();
        let out = llm.step_output()?;
        steps += 1;
        // (A step with no tokens finishes one launched ahead for sequences that had stopped.)
        if out.num_prefill_tokens == 0 && out.num_decode_tokens > 0 {
            decode_steps += 1;
            decode_secs += t.elapsed().as_secs_f64();
            decode_tokens += out.num_decode_tokens;
        }
        for f in out.finished {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            ttft.extend(f.timing.ttft().map(ms));
            tpot.extend(f.timing.tpot(f.output.len()).map(ms));
            output_tokens += f.output.len();
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let prompt_tokens: usize = work.iter().map(|w| w.prompt.len()).sum();
    let result = BenchResult {
        model: name,
        device: llm.device().to_string(),
        startup: llm.startup_report().to_string(),
        workload: spec,
        prompt_tokens,
        output_tokens,
        seconds,
        output_tok_s: output_tokens as f64 / seconds,
        total_tok_s: (prompt_tokens + output_tokens) as f64 / seconds,
        ttft_ms: Percentiles::of(&ttft),
        tpot_ms: Percentiles::of(&tpot),
        steps,
        decode_steps,
        mean_decode_step_ms: decode_secs * 1e3 / decode_steps.max(1) as f64,
        mean_decode_batch: decode_tokens as f64 / decode_steps.max(1) as f64,
        num_preemptions: llm.engine().scheduler().num_preemptions(),
    };
    println!(
        "workload: {} sequences, input {}..={}, output {}..={}, seed {}",
        spec.num_seqs, spec.min_input, spec.max_input, spec.min_output, spec.max_output, spec.seed
    );
    println!(
        "{prompt_tokens} prompt tokens and {output_tokens} output tokens in {seconds:.2} s ({steps} steps)"
    );
    println!(
        "output throughput {:.0} tok/s, total throughput {:.0} tok/s",
        result.output_tok_s, result.total_tok_s
    );
    println!(
        "time to first token p50 {:.1} ms, p99 {:.1} ms; time per output token p50 {:.2} ms, p99 {:.2} ms",
        result.ttft_ms.p50, result.ttft_ms.p99, result.tpot_ms.p50, result.tpot_ms.p99
    );
    println!(
        "decode steps: {decode_steps}, mean {:.2} ms at a mean batch of {:.0}; preemptions: {}",
        result.mean_decode_step_ms, result.mean_decode_batch, result.num_preemptions
    );
    let json = serde_json::to_string_pretty(&result).map_err(|e| Error::Internal(e.to_string()))?;
    std::fs::write(&args.json, json)
        .map_err(|e| Error::Internal(format!("{}: {e}", args.json.display())))?;
    println!("wrote {}", args.json.display());
    Ok(())
}
