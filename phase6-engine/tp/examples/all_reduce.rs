//! What one all-reduce of the hidden state costs between GPUs: the collective a tensor-parallel
//! decoder runs twice a layer (and once after the embedding), timed through the ranks' own NCCL
//! groups.
//!
//! `cargo run --release -p phase6-tp --features cuda --example all_reduce -- --tp 2`
//! (`--hidden 4096 --tokens 1,64,128,256 --per-step 73` are the defaults: Qwen3-8B's hidden size,
//! and its 36 layers' 72 all-reduces plus the embedding's).
//!
//! For each size, bf16 `[tokens, hidden]` on every rank: launched one by one (the eager step),
//! and `--per-step` of them captured into one CUDA graph and replayed (as in a decode graph).
//! Printed: microseconds per all-reduce, the bus bandwidth NCCL's tests report
//! (`bytes / time x 2 (tp - 1) / tp`, what each rank's links carry), and a step's worth. The
//! first all-reduce of each size is checked: rank r sends r + 1 everywhere, every rank must read
//! the sum.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use clap::Parser;

use kernels::{Gpu, bf16, graph};
use phase6_tp::cuda::nccl::{self, NcclGroup};

/// The measurement's options.
#[derive(Parser)]
struct Args {
    /// Ranks, one GPU each.
    #[arg(long, default_value_t = 2)]
    tp: usize,
    /// Elements of one token's hidden state.
    #[arg(long, default_value_t = 4096)]
    hidden: usize,
    /// Tokens of each size measured.
    #[arg(long, value_delimiter = ',', default_value = "1,64,128,256")]
    tokens: Vec<usize>,
    /// All-reduces captured into one graph, as in a decode step.
    #[arg(long, default_value_t = 73)]
    per_step: usize,
}

const EAGER_CALLS: usize = 1000;
const REPLAYS: usize = 20;

/// One size's times on one rank: seconds per all-reduce, eager and from a graph.
struct Times {
    eager: f64,
    graphed: f64,
}

/// Rank `rank`'s share of the measurement, for every size in `tokens`.
fn rank_times(
    rank: usize,
    tp: usize,
    id: [std::ffi::c_char; 128],
    hidden: usize,
    tokens: &[usize],
    per_step: usize,
    barrier: &Barrier,
) -> Result<Vec<Times>, String> {
    let gpu = Gpu::open(rank).map_err(|e| e.to_string())?;
    // Every rank runs the same collectives and ends with the others: the group counts as
    // started, so its communicators are freed at the end.
    let started = Arc::new(AtomicBool::new(true));
    let group = NcclGroup::join(&gpu, rank, tp, id, started)?;
    let mut out = Vec::new();
    for &t in tokens {
        let mine = vec![bf16::from_f32((rank + 1) as f32); t * hidden];
        let mut data = gpu.upload(&mine).map_err(|e| e.to_string())?;
        let reduce =
            |data: &mut kernels::CudaSlice<bf16>| group.all_reduce_sum(&mut data.slice_mut(..));
        reduce(&mut data).map_err(|e| e.to_string())?;
        let want = (tp * (tp + 1) / 2) as f32;
        let got = gpu.download(&data).map_err(|e| e.to_string())?;
        if let Some(bad) = got.iter().find(|x| x.to_f32() != want) {
            return Err(format!("rank {rank}: the sum is {bad}, not {want}"));
        }
        for _ in 0..20 {
            reduce(&mut data).map_err(|e| e.to_string())?;
        }
        gpu.synchronize().map_err(|e| e.to_string())?;
        barrier.wait();
        let start = Instant::now();
        for _ in 0..EAGER_CALLS {
            reduce(&mut data).map_err(|e| e.to_string())?;
        }
        gpu.synchronize().map_err(|e| e.to_string())?;
        let eager = start.elapsed().as_secs_f64() / EAGER_CALLS as f64;
        let step = graph::capture(&gpu, || (0..per_step).try_for_each(|_| reduce(&mut data)))
            .map_err(|e| e.to_string())?;
        step.launch().map_err(|e| e.to_string())?;
        gpu.synchronize().map_err(|e| e.to_string())?;
        barrier.wait();
        let start = Instant::now();
        for _ in 0..REPLAYS {
            step.launch().map_err(|e| e.to_string())?;
        }
        gpu.synchronize().map_err(|e| e.to_string())?;
        let graphed = start.elapsed().as_secs_f64() / (REPLAYS * per_step) as f64;
        out.push(Times { eager, graphed });
    }
    Ok(out)
}

fn main() -> Result<(), String> {
    let Args {
        tp,
        hidden,
        tokens,
        per_step,
    } = Args::parse();
    let found = kernels::device_count().map_err(|e| e.to_string())?;
    if found < tp {
        return Err(format!("--tp {tp} needs {tp} GPUs, {found} found"));
    }
    nccl::ensure_loadable(false)?;
    let id = nccl::new_group_id()?;
    let barrier = Arc::new(Barrier::new(tp));
    let per_rank: Vec<Vec<Times>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..tp)
            .map(|rank| {
                let (tokens, barrier) = (&tokens, barrier.clone());
                s.spawn(move || rank_times(rank, tp, id, hidden, tokens, per_step, &barrier))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect::<Result<_, _>>()
    })?;
    println!(
        "all-reduce of bf16 [tokens, {hidden}] over {tp} GPUs, NCCL {}; the slowest rank\n",
        nccl::version()?
    );
    println!(
        "| tokens | bytes | eager: us | eager: bus GB/s | in a graph: us | in a graph: bus GB/s | {per_step} in a graph: us |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let bus = |bytes: f64, secs: f64| bytes / secs * 2.0 * (tp - 1) as f64 / tp as f64 / 1e9;
    for (i, &t) in tokens.iter().enumerate() {
        let slowest = |f: fn(&Times) -> f64| per_rank.iter().map(|r| f(&r[i])).fold(0.0, f64::max);
        let (eager, graphed) = (slowest(|x| x.eager), slowest(|x| x.graphed));
        let bytes = (t * hidden * 2) as f64;
        println!(
            "| {t} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
            t * hidden * 2,
            eager * 1e6,
            bus(bytes, eager),
            graphed * 1e6,
            bus(bytes, graphed),
            graphed * per_step as f64 * 1e6
        );
    }
    Ok(())
}
