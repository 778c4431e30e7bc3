//! The decode step's products, Qwen3-0.6B's shapes, at batch sizes 1-256: cuBLAS's default
//! GEMM against split-K (`kernels::split_k`) with 2-16 ranges. Each call runs the product over
//! 28 different weight matrices, one per layer as a decode step does, so the weights come from
//! memory and not from L2, recorded into a CUDA graph as the engine's decode step is. Times are
//! device times between CUDA events, the median of 15 batches of 10 replays, per product; "GB/s" is the weight bytes read per second. The split-K times
//! count the GEMM alone (the engine sums the partials inside the next kernel) and, in brackets,
//! with a separate `sum_splits` pass. Without a GPU it says so and exits.

mod common;

use common::fill;
use kernels::split_k::{self, linear_partials, sum_splits};
use kernels::{CudaSlice, Gpu, bf16, graph, linear};

const LAYERS: usize = 28;
const HIDDEN: usize = 1024;

/// Device seconds per call of `f`, recorded once into a CUDA graph as a decode step is (launched
/// one by one, a few-microsecond product would time the host's launch rate).
fn time_in_graph(gpu: &Gpu, f: &mut impl FnMut()) -> f64 {
    f();
    gpu.synchronize().unwrap();
    let graph = graph::capture(gpu, || {
        f();
        Ok(())
    })
    .unwrap();
    common::time(gpu, &mut || graph.launch().unwrap())
}

fn main() {
    let gpu = match Gpu::open(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("gemm bench skipped: {e}");
            return;
        }
    };
    gpu.preload().unwrap();
    println!(
        "decode-step products on {} ({} SMs), {LAYERS} weight matrices per call; us per product\n",
        gpu.name().unwrap(),
        gpu.num_sms()
    );
    println!(
        "| product | rows | cuBLAS (us) | GB/s | split-K 2 / 4 / 8 / 16: GEMM (with sum_splits) | best | GB/s | speed-up |"
    );
    println!("|---|---:|---:|---:|---|---:|---:|---:|");
    let products = [
        ("qkv", 4096, HIDDEN),
        ("o_proj", HIDDEN, 2048),
        ("gate_up", 6144, HIDDEN),
        ("down", HIDDEN, 3072),
    ];
    let rows_list = [1, 8, 16, 32, 64, 96, 128, 160, 192, 256];
    let max_rows = *rows_list.last().unwrap();
    for (name, out, inp) in products {
        let one = fill(out * inp, 7);
        let weights: Vec<CudaSlice<bf16>> =
            (0..LAYERS).map(|_| gpu.upload(&one).unwrap()).collect();
        let x = gpu.upload(&fill(max_rows * inp, 3)).unwrap();
        let mut y = gpu.zeros::<bf16>(max_rows * out).unwrap();
        let mut parts = gpu
            .zeros::<f32>(split_k::MAX_SPLITS * max_rows * out)
            .unwrap();
        let gb = (out * inp * 2) as f64 / 1e9;
        for rows in rows_list {
            let plain = time_in_graph(&gpu, &mut || {
                for w in &weights {
                    linear::linear(&gpu, &x, w, &mut y, rows, out, inp).unwrap();
                }
            }) / LAYERS as f64;
            let mut cells = Vec::new();
            let mut best = (1, plain);
            for splits in [2, 4, 8, 16] {
                if !inp.is_multiple_of(8 * splits) {
                    continue;
                }
                let gemm = time_in_graph(&gpu, &mut || {
                    for w in &weights {
                        linear_partials(&gpu, &x, w, &mut parts, rows, out, inp, splits).unwrap();
                    }
                }) / LAYERS as f64;
                let with_sum = time_in_graph(&gpu, &mut || {
                    for w in &weights {
                        linear_partials(&gpu, &x, w, &mut parts, rows, out, inp, splits).unwrap();
                        sum_splits(&gpu, &parts, &mut y, rows, out, splits).unwrap();
                    }
                }) / LAYERS as f64;
                cells.push(format!("{:.1} ({:.1})", gemm * 1e6, with_sum * 1e6));
                if gemm < best.1 {
                    best = (splits, gemm);
                }
            }
            println!(
                "| {name} | {rows} | {:.1} | {:.0} | {} | {} | {:.0} | {:.2}x |",
                plain * 1e6,
                gb / plain,
                cells.join(" / "),
                best.0,
                gb / best.1,
                plain / best.1
            );
        }
    }
}
