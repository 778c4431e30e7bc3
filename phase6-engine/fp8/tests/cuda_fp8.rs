//! The CUDA runner's FP8 K/V cache against this chapter's CPU reference (the same arithmetic in
//! f32): the logits of a prefill and of the decode steps after it on fixture models, through the
//! decode kernel and the graphs; the pages an FP8 cache gets from the same memory; K/V copies
//! and a shared prefix. The GPU is fed the reference's greedy tokens, so every step is compared
//! on the same input. It computes in bf16 and rounds its own K/V to e4m3, so its token is checked
//! where the reference's top two logits lie far apart: two logits each off by at most `e` trade
//! places only if their gap is under `2e`, and `e` is bounded from the step's errors that do not
//! involve the GPU's FP8 logits (see the test). Without a GPU each test says why it is skipped.

use std::io::Write;

use phase1::{BlockTable, KvDtype, KvPool};
use phase2::{
    ForwardBatch, ForwardSeq, Model, ModelConfig, ModelRunner, SampleSpec, Weights, models_dir,
    sampler::top2_gap,
};
use phase6_chunks::ChunkRunner;
use phase6_cuda::{CudaOptions, CudaRunner};
use phase6_fp8::Fp8CpuRunner;
use phase6_fp8::measure::{Sequences, argmax, rel_error};

use kernels::decode::DecodeKernel;

#[path = "../../cuda/tests/shapes/mod.rs"]
mod shapes;

fn have_gpu() -> bool {
    match kernels::Gpu::open(0) {
        Ok(_) => true,
        Err(kernels::Error::NoDevice(reason)) => {
            let name = std::thread::current().name().unwrap_or("test").to_string();
            let _ = std::io::stderr()
                .lock()
                .write_all(format!("{name}: skipped: {reason}\n").as_bytes());
            false
        }
        Err(other) => panic!("a GPU is present but cannot be used: {other}"),
    }
}

fn say(line: String) {
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

fn load(name: &str) -> (ModelConfig, Weights) {
    let dir = if name == "tiny-shakespeare" {
        models_dir().join(name)
    } else {
        models_dir().join("fixtures").join(name)
    };
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    (config, Weights::open(&dir).unwrap())
}

fn options(dtype: KvDtype, eager: bool) -> CudaOptions {
    CudaOptions {
        page_size: 16,
        num_pages: Some(160),
        max_num_batched_tokens: 2048,
        max_num_seqs: 8,
        enforce_eager: eager,
        kv_cache_dtype: dtype,
        ..CudaOptions::default()
    }
}

/// The logits of each step after `prompt` when the tokens fed back are `tokens` (the last one
/// is not fed).
fn follow(runner: &mut dyn ModelRunner, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut seqs = Sequences::new(runner, 1).unwrap();
    let mut rows = Vec::new();
    let mut next = vec![prompt.to_vec()];
    for &t in tokens {
        rows.push(seqs.step(&next).unwrap().remove(0));
        next = vec![vec![t]];
    }
    rows
}

/// `steps` greedy tokens after `prompt`, with each step's logits.
fn greedy(runner: &mut dyn ModelRunner, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut seqs = Sequences::new(runner, 1).unwrap();
    let (mut tokens, mut rows) = (Vec::new(), Vec::new());
    let mut next = vec![prompt.to_vec()];
    for _ in 0..steps {
        let row = seqs.step(&next).unwrap().remove(0);
        let t = argmax(&row);
        tokens.push(t);
        rows.push(row);
        next = vec![vec![t]];
    }
    (tokens, rows)
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn fp8_cache_on_the_gpu_follows_the_cpu_reference() {
    if !have_gpu() {
        return;
    }
    let gpu = kernels::Gpu::open(0).unwrap();
    let names = ["tiny-shakespeare", "qwen3-yarn", "qwen2-bias", "llama-gqa"];
    let cases = names.iter().map(|&n| (n.to_string(), load(n)));
    let cases = cases.chain([(
        "head_dim 128, random weights".to_string(),
        shapes::tiny_shakespeare_head_dim_128(),
    )]);
    for (name, (config, weights)) in cases {
        let group = config.num_heads / config.num_kv_heads;
        let kernel = DecodeKernel::best(&gpu, config.head_dim, group, true);
        say(format!("{name}: FP8 decode through {kernel:?}"));
        if gpu.arch().is_hopper() && config.head_dim == 128 {
            assert_eq!(kernel, DecodeKernel::BulkCopies, "{name}");
        }
        let model = Model::from_weights(config.clone(), &weights).unwrap();
        let prompt: Vec<u32> = (0..300)
            .map(|i| ((i * 7919 + 11) % config.vocab_size) as u32)
            .collect();
        let mut cpu_f32 = phase2::CpuRunner::new(model.clone(), 160, 16);
        let mut cpu_fp8 = Fp8CpuRunner::new(model, 160, 16, false);
        let (want_tokens, want_rows) = greedy(&mut cpu_fp8, &prompt, 32);
        let f32_rows = follow(&mut cpu_f32, &prompt, &want_tokens);
        let want_f32 = f32_rows[0].clone();
        for eager in [true, false] {
            let mut bf16 =
                CudaRunner::new(&config, &weights, options(KvDtype::BF16, eager)).unwrap();
            let mut fp8 =
                CudaRunner::new(&config, &weights, options(KvDtype::Fp8E4m3, eager)).unwrap();
            let bf16_rows = follow(&mut bf16, &prompt, &want_tokens);
            let got_bf16 = bf16_rows[0].clone();
            let rows = follow(&mut fp8, &prompt, &want_tokens);
            let e = max_abs(&rows[0], &want_rows[0]);
            let rel = rel_error(&rows[0], &want_rows[0]);
            let rel_bf16 = rel_error(&got_bf16, &want_f32);
            let rel_fp8_cost = rel_error(&want_rows[0], &want_f32);
            let rel_gpu_cost = rel_error(&rows[0], &want_f32);
            say(format!(
                "{name} (eager {eager}): FP8 GPU vs FP8 CPU rel {rel:.2e} (max abs {e:.3}); bf16 GPU vs f32 CPU rel {rel_bf16:.2e}; FP8 CPU vs f32 CPU rel {rel_fp8_cost:.2e}; FP8 GPU vs f32 CPU rel {rel_gpu_cost:.2e}"
            ));
            // The GPU pays what the reference says FP8 costs: no less (it quantizes) and no
            // more (it quantizes the same way).
            let ratio = rel_gpu_cost / rel_fp8_cost;
            assert!(
                (0.5..=2.0).contains(&ratio),
                "{name}: FP8 cost on the GPU {rel_gpu_cost} vs {rel_fp8_cost}"
            );
            // The GPU's own rounding (bf16 between kernels) plus keys that land on the other
            // side of an e4m3 rounding boundary: a few times the bf16 runner's error.
            assert!(
                rel < 4.0 * rel_bf16 + 0.02,
                "{name}: rel {rel} vs bf16 {rel_bf16}"
            );
            // Every step after it, on the same tokens: the decode kernel over FP8 pages, and the
            // graphs. Two FP8 caches round K and V on either side of an e4m3 boundary here and
            // there (the GPU rounds bf16 values, the reference f32 ones), so a step's logits
            // differ from the reference's by about what FP8 costs the reference: the GPU's cost
            // stays within twice the sum of the reference's cost and the bf16 runner's own error.
            // A logit of the GPU's is off from the reference's by at most its own error against
            // the f32 runner plus the reference's, about 2a + b <= 2(a + b) (a the reference's
            // largest error against the f32 runner, b the bf16 runner's): where the reference's
            // top two logits lie 4(a + b) apart, they cannot trade places, and the token must be
            // the reference's.
            let (mut checked, mut worst) = (0, 0.0f32);
            for (step, (row, want)) in rows.iter().zip(&want_rows).enumerate() {
                let exact = &f32_rows[step];
                let (gpu_cost, fp8_cost) = (rel_error(row, exact), rel_error(want, exact));
                let bf16_error = rel_error(&bf16_rows[step], exact);
                let ratio = gpu_cost / (fp8_cost + bf16_error);
                worst = worst.max(ratio);
                assert!(
                    ratio <= 2.0,
                    "{name} (eager {eager}): step {step}: FP8 cost on the GPU {gpu_cost}, in the \
                     reference {fp8_cost}, bf16 error {bf16_error}"
                );
                let off = max_abs(want, exact) + max_abs(&bf16_rows[step], exact);
                if top2_gap(want) >= 4.0 * off {
                    assert_eq!(
                        argmax(row),
                        want_tokens[step],
                        "{name} (eager {eager}): token {step}"
                    );
                    checked += 1;
                }
            }
            say(format!(
                "{name} (eager {eager}): 32 steps, FP8 cost on the GPU at most {worst:.2}x the sum \
                 of the reference's and bf16's error; the token checked at {checked} of them, all \
                 equal"
            ));
        }
    }
}

#[test]
fn the_same_memory_holds_twice_the_pages() {
    if !have_gpu() {
        return;
    }
    let (config, weights) = load("qwen3-yarn");
    let sized = |dtype| CudaOptions {
        num_pages: None,
        gpu_memory_utilization: 0.3,
        ..options(dtype, true)
    };
    let bf16 = CudaRunner::new(&config, &weights, sized(KvDtype::BF16)).unwrap();
    let pages_bf16 = bf16.num_pages();
    drop(bf16);
    let fp8 = CudaRunner::new(&config, &weights, sized(KvDtype::Fp8E4m3)).unwrap();
    say(format!("{}", fp8.memory_report()));
    let ratio = fp8.num_pages() as f64 / pages_bf16 as f64;
    // The budget is what is left once everything else is allocated, measured for each runner
    // (one dropped just before may not have handed every byte back): about 2x (1.97 measured).
    assert!(
        (1.9..=2.05).contains(&ratio),
        "{} vs {pages_bf16}",
        fp8.num_pages()
    );
    assert_eq!(fp8.kv_layout().dtype, KvDtype::Fp8E4m3);
}

/// A new segment of `n` token slots from `pool`.
fn segment(pool: &mut KvPool, n: usize) -> BlockTable {
    let mut t = BlockTable::new();
    t.append_tokens(pool, n).unwrap();
    t
}

fn tokens(n: usize, from: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (from + 41 * i) % 2000 + 5).collect()
}

/// The chunk API on an FP8 cache: K/V prefilled at position 0, moved behind a prefix with a
/// RoPE turn (`copy_kv`: read, turn, round again), then attended, as the CPU reference does; and
/// two sequences sharing the prefix in one step (which the runner attends as a cascade group).
#[test]
fn fp8_chunks_move_and_share_like_the_cpu_reference() {
    if !have_gpu() {
        return;
    }
    let (config, weights) = load("tiny-shakespeare");
    let model = Model::from_weights(config.clone(), &weights).unwrap();
    let mut gpu = CudaRunner::new(&config, &weights, options(KvDtype::Fp8E4m3, true)).unwrap();
    let mut cpu = Fp8CpuRunner::new(model, 160, 16, false);
    let mut pool = KvPool::new(160, 16).unwrap();
    let (prefix, own) = (segment(&mut pool, 30), segment(&mut pool, 40));
    let (moved, unturned) = (segment(&mut pool, 40), segment(&mut pool, 40));
    let prefill = |r: &mut dyn ModelRunner, kv: Vec<BlockTable>, toks: Vec<u32>, start: usize| {
        let seq = ForwardSeq {
            seq_id: 9,
            tokens: toks,
            start_pos: start,
            kv,
            sample: None,
        };
        r.forward(&ForwardBatch { seqs: vec![seq] }).unwrap();
    };
    for r in [&mut gpu as &mut dyn ModelRunner, &mut cpu] {
        prefill(r, vec![prefix.clone()], tokens(30, 1), 0);
        prefill(r, vec![own.clone()], tokens(40, 2), 0);
    }
    cpu.copy_kv(&own, &moved, 30).unwrap();
    gpu.copy_kv(&own, &moved, 30).unwrap();
    gpu.copy_kv(&own, &unturned, 0).unwrap();
    let after = |context: &BlockTable, pool: &mut KvPool, id: u64| ForwardSeq {
        seq_id: id,
        tokens: tokens(3, 3 + id as u32),
        start_pos: 70,
        kv: vec![prefix.clone(), context.clone(), segment(pool, 3)],
        sample: Some(SampleSpec::greedy()),
    };
    let seq = after(&moved, &mut pool, 0);
    let one = |s: &ForwardSeq| ForwardBatch {
        seqs: vec![s.clone()],
    };
    let want = cpu.forward(&one(&seq)).unwrap().data;
    let got = gpu.forward(&one(&seq)).unwrap().data;
    let wrong = gpu
        .forward(&one(&after(&unturned, &mut pool, 0)))
        .unwrap()
        .data;
    let (rel, rel_wrong) = (rel_error(&got, &want), rel_error(&wrong, &want));
    say(format!(
        "moved FP8 K/V vs the CPU reference: rel {rel:.2e}; without the turn {rel_wrong:.2e}"
    ));
    // The embedded model's FP8 GPU-vs-reference error on a whole prompt is 8e-3.
    assert!(rel < 3e-2, "{rel}");
    assert!(rel_wrong > 3.0 * rel, "{rel_wrong} vs {rel}");

    // Two sequences behind the shared prefix, in one step.
    let (a, b) = (segment(&mut pool, 20), segment(&mut pool, 25));
    let shared = |own: &BlockTable, id: u64, n: usize| ForwardSeq {
        seq_id: id,
        tokens: tokens(n, 7 + id as u32),
        start_pos: 30,
        kv: vec![prefix.clone(), own.clone()],
        sample: Some(SampleSpec::greedy()),
    };
    let batch = ForwardBatch {
        seqs: vec![shared(&a, 1, 20), shared(&b, 2, 25)],
    };
    let want = cpu.forward(&batch).unwrap();
    let got = gpu.forward(&batch).unwrap();
    for i in 0..2 {
        let rel = rel_error(got.row(i), want.row(i));
        say(format!("shared prefix, sequence {i}: rel {rel:.2e}"));
        assert!(rel < 3e-2, "sequence {i}: {rel}");
    }
}
