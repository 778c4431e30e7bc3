//! Tensor parallelism on GPUs. One rank through NCCL gives the single-GPU runner's bits (its
//! all-reduces and all-gather move the same values, and its kernels are the same), which checks
//! the NCCL path, graphs included, on one GPU (not the cuts: one rank holds whole tensors). With two GPUs or more, ranks give the
//! single GPU's logits within bf16 rounding and its greedy tokens up to near-ties (see
//! `phase6-cuda`'s tests for the rule). Without a GPU, without NCCL, or with too few GPUs, each
//! test prints why it is skipped. Overlap scheduling over the ranks changes no token.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use phase0::{SamplingParams, SeqId, TokenId};
use phase1::{BlockTable, KvPool};
use phase2::sampler::{argmax, top2_gap};
use phase2::{ForwardBatch, ForwardSeq, ModelConfig, ModelRunner, SampleSpec, Weights, models_dir};
use phase5::{Engine, SchedulerConfig};
use phase6_chunks::ChunkRunner;
use phase6_cuda::{CudaOptions, CudaRunner, Overlap};
use phase6_tp::check_split;
use phase6_tp::cuda::{TpCudaRunner, nccl};

fn skip(why: &str) {
    let name = std::thread::current().name().unwrap_or("test").to_string();
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{name}: skipped: {why}\n").as_bytes());
}

/// GPUs here, or `None` (said on stderr) when the test cannot run.
fn gpus_with_nccl(needed: usize) -> Option<usize> {
    let n = match kernels::device_count() {
        Ok(n) if n > 0 => n,
        Ok(_) => {
            skip("no CUDA device");
            return None;
        }
        Err(e) => {
            skip(&e.to_string());
            return None;
        }
    };
    if n < needed {
        skip(&format!("{needed} GPUs needed, {n} here"));
        return None;
    }
    if let Err(why) = nccl::ensure_loadable(false) {
        skip(&why);
        return None;
    }
    let version = nccl::version().unwrap_or_else(|e| e);
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{n} GPUs, NCCL {version}\n").as_bytes());
    Some(n)
}

fn options(enforce_eager: bool) -> CudaOptions {
    CudaOptions {
        page_size: 16,
        num_pages: Some(64),
        max_num_batched_tokens: 1024,
        max_num_seqs: 8,
        enforce_eager,
        ..CudaOptions::default()
    }
}

fn load(name: &str) -> (ModelConfig, Weights) {
    let dir = models_dir().join("fixtures").join(name);
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    (config, Weights::open(Path::new(&dir)).unwrap())
}

/// A greedy run of `steps` tokens after `prompt`: every step's logits and the tokens.
fn greedy(runner: &mut dyn ModelRunner, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut pool = KvPool::new(runner.num_pages(), runner.page_size()).unwrap();
    let mut table = BlockTable::new();
    let (mut logits, mut tokens) = (Vec::new(), Vec::new());
    let mut input = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..steps {
        table.append_tokens(&mut pool, input.len()).unwrap();
        let batch = ForwardBatch {
            seqs: vec![ForwardSeq {
                seq_id: 0,
                tokens: input.clone(),
                start_pos: pos,
                kv: vec![table.clone()],
                sample: Some(SampleSpec::greedy()),
            }],
        };
        let row = runner.forward(&batch).unwrap().data;
        let next = argmax(&row);
        pos += input.len();
        input = vec![next];
        logits.push(row);
        tokens.push(next);
    }
    (logits, tokens)
}

const FIXTURES: [&str; 3] = ["qwen2-bias", "llama32-tied-llama3", "qwen3-yarn"];

fn prompt(vocab: usize) -> Vec<u32> {
    (0..40).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

#[test]
fn one_rank_over_nccl_gives_the_single_gpu_bits() {
    if gpus_with_nccl(1).is_none() {
        return;
    }
    for name in FIXTURES {
        let (config, weights) = load(name);
        for eager in [true, false] {
            let mut single = CudaRunner::new(&config, &weights, options(eager)).unwrap();
            let mut ranks = TpCudaRunner::new(&config, &weights, options(eager), 1).unwrap();
            let p = prompt(config.vocab_size);
            let want = greedy(&mut single, &p, 12);
            let got = greedy(&mut ranks, &p, 12);
            assert_eq!(got.1, want.1, "{name} (eager {eager}): tokens");
            for (step, (a, b)) in got.0.iter().zip(&want.0).enumerate() {
                assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{name} (eager {eager}): logits of step {step} differ"
                );
            }
            // Two sequences behind one shared prefix: a cascade group, planned alike.
            let shared = shared_prefix_step(&mut single, &p);
            assert_eq!(
                shared_prefix_step(&mut ranks, &p),
                shared,
                "{name}: shared prefix"
            );
            assert_eq!(ranks.cascade_stats(), single.cascade_stats());
            assert!(
                single.cascade_stats().steps > 0,
                "{name}: the step had a cascade group"
            );
        }
    }
}

/// One step of two sequences that share `prompt` as their first segment, on fresh pages.
fn shared_prefix_step(runner: &mut dyn ChunkRunner, prompt: &[u32]) -> Vec<f32> {
    let mut pool = KvPool::new(runner.num_pages(), runner.page_size()).unwrap();
    let mut prefix = BlockTable::new();
    prefix.append_tokens(&mut pool, prompt.len()).unwrap();
    let first = ForwardSeq {
        seq_id: 0,
        tokens: prompt.to_vec(),
        start_pos: 0,
        kv: vec![prefix.clone()],
        sample: None,
    };
    runner.forward(&ForwardBatch { seqs: vec![first] }).unwrap();
    let seqs = (1..3)
        .map(|i| {
            let mut own = BlockTable::new();
            own.append_tokens(&mut pool, 5).unwrap();
            ForwardSeq {
                seq_id: i,
                tokens: vec![i as u32 + 7; 5],
                start_pos: prompt.len(),
                kv: vec![prefix.clone(), own],
                sample: Some(SampleSpec::greedy()),
            }
        })
        .collect();
    runner.forward(&ForwardBatch { seqs }).unwrap().data
}

#[test]
fn ranks_on_several_gpus_match_one() {
    let Some(gpus) = gpus_with_nccl(2) else {
        return;
    };
    for name in FIXTURES {
        let (config, weights) = load(name);
        let mut single = CudaRunner::new(&config, &weights, options(false)).unwrap();
        let p = prompt(config.vocab_size);
        let (want_logits, want_tokens) = greedy(&mut single, &p, 16);
        drop(single);
        for tp in [2, 4, 8].into_iter().filter(|&tp| tp <= gpus) {
            if let Err(why) = check_split(&config, tp) {
                skip(&format!("{name} at {tp} ranks: {why}"));
                continue;
            }
            let mut ranks = TpCudaRunner::new(&config, &weights, options(false), tp).unwrap();
            let (logits, tokens) = greedy(&mut ranks, &p, 16);
            // The prefill's largest logit error sets how close two logits may be and still be
            // ordered alike (as in the CUDA runner's tests).
            let err = logits[0]
                .iter()
                .zip(&want_logits[0])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            let scale = want_logits[0].iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(
                err <= 0.05 * scale.max(1.0),
                "{name} tp {tp}: logit error {err}"
            );
            for (step, (a, b)) in tokens.iter().zip(&want_tokens).enumerate() {
                if top2_gap(&want_logits[step]) < 4.0 * err {
                    break;
                }
                assert_eq!(a, b, "{name} tp {tp}: token {step}");
            }
        }
    }
}

/// Eight requests (greedy and seeded) run to completion on `ranks`, one step at a time or with
/// the next step decided while the ranks compute (overlap scheduling): each request's output by
/// its id (ids follow the order of `prompts`), after checking that every page came back.
fn run_requests(
    ranks: TpCudaRunner,
    prompts: &[Vec<TokenId>],
    overlap: bool,
) -> BTreeMap<SeqId, Vec<TokenId>> {
    // Prompts cut in 64-token chunks, beside decodes: mixed steps, then decode-only ones.
    let config = SchedulerConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        chunk_size: Some(64),
        ..SchedulerConfig::default()
    };
    let pages = ranks.num_pages();
    let mut engine = Engine::new(ranks, config, vec![], 7).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let params = match i % 2 {
            0 => SamplingParams::greedy(),
            _ => SamplingParams::default()
                .with_temperature(0.8)
                .with_seed(i as u64),
        };
        let params = params.with_max_tokens(6 + 5 * i).with_ignore_eos(true);
        engine.add_request(p.clone(), params).unwrap();
    }
    let done = match overlap {
        true => Overlap::new(true).run_to_completion(&mut engine, |r| r),
        false => engine.run_to_completion(),
    };
    let outputs = done
        .unwrap()
        .into_iter()
        .map(|f| (f.id, f.output))
        .collect();
    engine.scheduler_mut().clear_cache();
    let free = engine.scheduler().pool().num_free();
    assert_eq!(free, pages, "every page back");
    outputs
}

#[test]
fn overlapped_ranks_give_the_tokens_of_one_step_at_a_time() {
    let Some(gpus) = gpus_with_nccl(1) else {
        return;
    };
    let (config, weights) = load("qwen3-yarn");
    let prompts: Vec<Vec<TokenId>> = (0..8)
        .map(|i| {
            (0..20 + 37 * i)
                .map(|j| ((j * 7919 + i * 13) % config.vocab_size) as u32)
                .collect()
        })
        .collect();
    for tp in [1, 2].into_iter().filter(|&tp| tp <= gpus) {
        let ranks = || TpCudaRunner::new(&config, &weights, options(false), tp).unwrap();
        let sync = run_requests(ranks(), &prompts, false);
        let overlapped = run_requests(ranks(), &prompts, true);
        assert_eq!(overlapped, sync, "tp {tp}");
        let lengths: Vec<usize> = sync.values().map(Vec::len).collect();
        let asked: Vec<usize> = (0..prompts.len()).map(|i| 6 + 5 * i).collect();
        assert_eq!(lengths, asked, "tp {tp}: every request ran to its length");
    }
}

#[test]
fn more_ranks_than_gpus_is_refused_before_anything_is_loaded() {
    let n = match kernels::device_count() {
        Ok(n) if n > 0 => n,
        _ => return skip("no CUDA device"),
    };
    let (config, weights) = load("qwen3-hd64-mha-wide");
    let tp = (n + 1).next_power_of_two().min(8);
    if tp <= n {
        return skip("8 GPUs here: no larger split to refuse");
    }
    let err = TpCudaRunner::new(&config, &weights, options(true), tp)
        .err()
        .expect("refused");
    assert!(
        err.to_string()
            .contains(&format!("needs {tp} GPUs, {n} found")),
        "{err}"
    );
}
