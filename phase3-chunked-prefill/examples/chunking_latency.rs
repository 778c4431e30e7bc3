//! What chunked prefill buys: the time between decode tokens of short requests while a long
//! prompt arrives, with and without chunking, on the embedded model (CPU).
//!
//! `cargo run --release -p phase3 --example chunking_latency [-- CHUNK_SIZE...]`

use std::time::Instant;

use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::{CpuRunner, Model, SeqState};
use phase3::{ChunkedPrefillConfig, ChunkedScheduler};

const SHORT: usize = 4;
const LONG_PROMPT: usize = 1500;

/// Runs 4 short requests; a 1,500-token prompt arrives at step 5. Returns the worst and mean
/// gap between two tokens of a short request, and the total time.
fn run(model: &Model, chunk_size: usize) -> (f64, f64, f64) {
    let (pages, page_size) = (512, 16);
    let mut runner = CpuRunner::new(model.clone(), pages, page_size);
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: 2048,
        max_num_seqs: 16,
        chunk_size,
    };
    let mut s = ChunkedScheduler::new(KvPool::new(pages, page_size).unwrap(), config, vec![]);
    let request = |id: u64, len: usize, max_tokens: usize| {
        let prompt = (0..len as u32)
            .map(|i| 3 + (i * 31 + id as u32) % 2000)
            .collect();
        let params = SamplingParams::greedy()
            .with_max_tokens(max_tokens)
            .with_ignore_eos(true);
        SeqState::new(Sequence::new(Request::new(id, prompt, params)).unwrap(), id)
    };
    for id in 0..SHORT as u64 {
        s.add(request(id, 16, 40));
    }
    let mut last_token = [None::<Instant>; SHORT];
    let mut gaps = Vec::new();
    let start = Instant::now();
    let mut step = 0;
    while s.has_work() {
        if step == 5 {
            s.add(request(99, LONG_PROMPT, 4));
        }
        let out = s.step(&mut runner).unwrap();
        let now = Instant::now();
        for (id, _) in out.tokens {
            if let Some(prev) = last_token.get_mut(id as usize) {
                if let Some(t) = prev {
                    gaps.push(now.duration_since(*t).as_secs_f64() * 1e3);
                }
                *prev = Some(now);
            }
        }
        step += 1;
    }
    let worst = gaps.iter().copied().fold(0.0, f64::max);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    (worst, mean, start.elapsed().as_secs_f64())
}

fn main() {
    let model = Model::load(&phase2::default_model_dir()).expect("the embedded model loads");
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![usize::MAX, 512, 128];
    }
    println!("{SHORT} short requests decoding, a {LONG_PROMPT}-token prompt arrives at step 5\n");
    println!("| chunk size | worst gap between tokens | mean gap | total time |");
    println!("| --- | --- | --- | --- |");
    for chunk in sizes {
        let (worst, mean, total) = run(&model, chunk);
        let label = if chunk == usize::MAX {
            "none (whole prompt)".to_string()
        } else {
            chunk.to_string()
        };
        println!("| {label} | {worst:.1} ms | {mean:.1} ms | {total:.2} s |");
    }
}
