//! Static batching against continuous batching on the embedded model (CPU): 48 requests with
//! mixed output lengths, 16 seats. Throughput and mean latency of each.
//!
//! `cargo run --release -p phase5 --example static_vs_continuous`

use std::time::{Duration, Instant};

use phase0::SamplingParams;
use phase2::{CpuRunner, Model};
use phase5::{Batching, Engine, SchedulerConfig};

fn main() {
    let model = Model::load(&phase2::default_model_dir()).expect("the embedded model loads");
    // Output lengths from 8 to 256, mixed: the long ones hold static batches back.
    let requests: Vec<(Vec<u32>, usize)> = (0..48u32)
        .map(|i| {
            let prompt = (0..32).map(|j| 3 + (i * 97 + j * 13) % 2000).collect();
            let out = [8, 16, 32, 256, 24, 64, 12, 128][i as usize % 8];
            (prompt, out)
        })
        .collect();
    let total_out: usize = requests.iter().map(|(_, n)| n).sum();
    println!("48 requests, 32-token prompts, {total_out} output tokens in all, 16 seats\n");
    println!("| batching | output tokens/s | mean latency | steps |");
    println!("| --- | --- | --- | --- |");
    for batching in [Batching::Static, Batching::Continuous] {
        let config = SchedulerConfig {
            max_num_seqs: 16,
            chunk_size: None,
            enable_prefix_caching: false,
            batching,
            ..SchedulerConfig::default()
        };
        let mut e =
            Engine::new(CpuRunner::new(model.clone(), 1024, 16), config, vec![], 0).unwrap();
        let start = Instant::now();
        for (prompt, n) in &requests {
            let params = SamplingParams::greedy()
                .with_max_tokens(*n)
                .with_ignore_eos(true);
            e.add_request(prompt.clone(), params).unwrap();
        }
        let mut steps = 0;
        let mut latencies = Duration::ZERO;
        while !e.is_finished() {
            for f in e.step().unwrap().finished {
                latencies += f.timing.latency().expect("finished");
            }
            steps += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "| {batching:?} | {:.0} | {:.2} s | {steps} |",
            total_out as f64 / secs,
            latencies.as_secs_f64() / requests.len() as f64
        );
    }
}
