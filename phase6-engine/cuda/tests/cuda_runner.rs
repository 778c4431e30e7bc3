//! The CUDA runner against the references: `transformers` fixtures and the CPU runner (greedy
//! tokens, last logits), cascade == flat attention on the device, split-KV prefill == one
//! causal pass, device sampling == the host
//! sampler, K/V moved by a RoPE shift == the CPU runner's, and chapter 5's properties through
//! `phase5::Engine` (batched == alone, a tiny pool preempts and still finishes with the same
//! tokens, every page comes back).
//!
//! The GPU computes in bf16, so greedy tokens can only be compared up to the first step where
//! the reference's top-2 logit gap is small enough for rounding to swap the two: two logits each
//! off by at most `e` can trade places only if their gap is below `2e`. The tolerance is
//! `4e`, with `e` the largest absolute logit error measured on the same prompt's prefill (the
//! factor 2 covers the decode steps, whose error was not measured). Without a GPU every test
//! prints why it is skipped.

use std::path::{Path, PathBuf};

mod shapes;

use kernels::prefill::PrefillKernel;
use phase0::{SamplingParams, SeqId, TokenId};
use phase1::{BlockTable, KvPool};
use phase2::{
    CpuRunner, Error, Fixture, FixtureCase, ForwardBatch, ForwardSeq, Logits, Model, ModelConfig,
    ModelRunner, SampleSpec, Weights, models_dir, sampler,
};
use phase5::{Batching, Engine, SchedulerConfig};
use phase6_chunks::{CascadeCpuRunner, ChunkRunner, SharedSegment, plan_cascade};
use phase6_cuda::{CudaOptions, CudaRunner, Overlap};
use phase6_cuda_plan::{KvSplit, Limits, StepPlan};

/// True when a GPU is here; otherwise says on stderr (uncaptured) why the test is skipped.
fn have_gpu() -> bool {
    use std::io::Write;
    match kernels::Gpu::open(0) {
        Ok(_) => true,
        Err(kernels::Error::NoDevice(reason)) => {
            let name = std::thread::current().name().unwrap_or("test").to_string();
            let line = format!("{name}: skipped: {reason}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            false
        }
        Err(other) => panic!("a GPU is present but cannot be used: {other}"),
    }
}

fn load(dir: &Path) -> (ModelConfig, Weights) {
    let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    (config, Weights::open(dir).unwrap())
}

fn options(num_pages: usize, max_num_seqs: usize, enforce_eager: bool) -> CudaOptions {
    CudaOptions {
        page_size: 16,
        num_pages: Some(num_pages),
        max_num_batched_tokens: 2048,
        max_num_seqs,
        enforce_eager,
        // Pieces of a page: every unmasked KV of three pages' worth or more is cut, so that the
        // split path is tested.
        split_kv_min_tokens: 16,
        ..CudaOptions::default()
    }
}

/// A greedy run: the prefill's last logits, the tokens, and each token's top-2 logit gap
/// (only where the step's logits were read back).
struct Run {
    first_logits: Vec<f32>,
    tokens: Vec<TokenId>,
    gaps: Vec<f32>,
}

/// Prefills `prompt` in one step and decodes `steps - 1` more tokens greedily. With
/// `device_sampling`, decode steps use `forward_sample` (no logits, no gaps).
fn greedy(
    runner: &mut impl ModelRunner,
    prompt: &[TokenId],
    steps: usize,
    device_sampling: bool,
) -> Run {
    let mut pool = KvPool::new(runner.num_pages(), runner.page_size()).unwrap();
    let mut table = BlockTable::new();
    table.append_tokens(&mut pool, prompt.len()).unwrap();
    let mut seq = ForwardSeq {
        seq_id: 0,
        tokens: prompt.to_vec(),
        start_pos: 0,
        kv: vec![table.clone()],
        sample: Some(SampleSpec::greedy()),
    };
    let first = runner.forward(&one(&seq)).unwrap();
    let mut run = Run {
        tokens: vec![sampler::argmax(first.row(0))],
        gaps: vec![sampler::top2_gap(first.row(0))],
        first_logits: first.data,
    };
    while run.tokens.len() < steps {
        table.append_slot(&mut pool).unwrap();
        seq.start_pos = table.num_tokens() - 1;
        seq.tokens = vec![*run.tokens.last().unwrap()];
        seq.kv = vec![table.clone()];
        if device_sampling {
            run.tokens
                .push(runner.forward_sample(&one(&seq)).unwrap()[0]);
        } else {
            let logits = runner.forward(&one(&seq)).unwrap();
            run.tokens.push(sampler::argmax(logits.row(0)));
            run.gaps.push(sampler::top2_gap(logits.row(0)));
        }
    }
    table.release(&mut pool).unwrap();
    run
}

fn one(seq: &ForwardSeq) -> ForwardBatch {
    ForwardBatch {
        seqs: vec![seq.clone()],
    }
}

/// ‖a − b‖ / ‖b‖ and max |a − b|.
fn errors(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den, mut max) = (0.0f64, 0.0f64, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        assert!(x.is_finite(), "non-finite logit {x}");
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
        max = max.max((x - y).abs());
    }
    ((num / den).sqrt() as f32, max)
}

/// Last logits of the bf16 device forward pass against an f32 reference, for the trained
/// model: `transformers` itself, run in bf16, is 2e-3 to 5e-3 off its f32 logits there.
const LOGITS_REL_TOL: f32 = 2e-2;

/// The same for the random-weight fixtures, whose logits reach ±50 and whose attention is far
/// more sensitive to rounding: `transformers` in bf16 is up to 4.4e-2 off its f32 logits
/// (llama-gqa, 200 tokens), 2.1e-2 on the Qwen2 one (measured on the fixtures' prompts).
const RANDOM_LOGITS_REL_TOL: f32 = 1e-1;

/// Tokens must equal the reference up to the first step whose reference gap is below `tol`;
/// returns how many leading tokens are equal.
fn agree(label: &str, got: &[TokenId], want: &[TokenId], gaps: &[f32], tol: f32) -> usize {
    let equal = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    let protected = gaps
        .iter()
        .position(|&g| g < tol)
        .unwrap_or(gaps.len())
        .min(want.len())
        .min(got.len());
    assert!(
        equal >= protected,
        "{label}: token {equal} is {} instead of {}, though the reference's gap there is {} (tolerance {tol})",
        got[equal],
        want[equal],
        gaps[equal]
    );
    equal
}

fn read_fixture(path: &Path) -> (String, Vec<FixtureCase>) {
    let f = Fixture::read(path).unwrap();
    (f.model_dir, f.cases)
}

#[test]
fn fixtures_greedy_tokens_and_logits_with_and_without_graphs() {
    if !have_gpu() {
        return;
    }
    let fixtures = models_dir().join("fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "fixtures in {}", fixtures.display());
    let mut failures = Vec::new();
    for file in files {
        let (dir, cases) = read_fixture(&file);
        let (config, weights) = load(&models_dir().join(&dir));
        let model = Model::from_weights(config.clone(), &weights).unwrap();
        let rel_tol = if dir.starts_with("fixtures/") {
            RANDOM_LOGITS_REL_TOL
        } else {
            LOGITS_REL_TOL
        };
        let references: Vec<Run> = cases
            .iter()
            .map(|case| {
                let mut cpu = CpuRunner::new(model.clone(), 160, 16);
                greedy(&mut cpu, &case.prompt, case.greedy.len(), false)
            })
            .collect();
        for eager in [false, true] {
            let mut gpu = CudaRunner::new(&config, &weights, options(160, 8, eager)).unwrap();
            eprintln!("{dir} ({}): {}", mode(eager), gpu.memory_report());
            for (case, reference) in cases.iter().zip(&references) {
                let label = format!("{dir} / {} ({})", case.name, mode(eager));
                let steps = case.greedy.len();
                let run = greedy(&mut gpu, &case.prompt, steps, true);
                let (rel, abs) = errors(&run.first_logits, &case.logits);
                let tol = 4.0 * abs;
                let checked = std::panic::catch_unwind(|| {
                    assert!(rel < rel_tol, "{label}: logits relative error {rel:.2e}");
                    let hf = agree(&label, &run.tokens, &case.greedy, &case.gaps, tol);
                    let cpu = agree(&label, &run.tokens, &reference.tokens, &reference.gaps, tol);
                    (hf, cpu)
                });
                match checked {
                    Ok((hf, cpu)) => eprintln!(
                        "{label}: logits rel {rel:.1e} max abs {abs:.1e}; \
                         tokens equal {hf}/{steps} (transformers), {cpu}/{steps} (CPU), \
                         near-tie tolerance {tol:.2e}"
                    ),
                    Err(_) => failures.push(label),
                }
            }
        }
    }
    assert!(failures.is_empty(), "failed: {failures:#?}");
}

fn mode(eager: bool) -> &'static str {
    if eager { "eager" } else { "graphs" }
}

fn tiny_shakespeare() -> (ModelConfig, Weights, Model) {
    let (config, weights) = load(&models_dir().join("tiny-shakespeare"));
    let model = Model::from_weights(config.clone(), &weights).unwrap();
    (config, weights, model)
}

/// Writes a segment's KV by prefilling it (after `before`, already written) as one sequence.
fn prefill_segment(
    runners: &mut [&mut dyn ModelRunner],
    before: &[BlockTable],
    segment: &BlockTable,
    tokens: &[TokenId],
) {
    let mut kv = before.to_vec();
    kv.push(segment.clone());
    let seq = ForwardSeq {
        seq_id: 99,
        tokens: tokens.to_vec(),
        start_pos: before.iter().map(BlockTable::num_tokens).sum(),
        kv,
        sample: None,
    };
    for r in runners {
        r.forward(&one(&seq)).unwrap();
    }
}

/// `n` token ids of the tiny model's vocabulary, `from` and `stride` telling sequences apart.
fn synthetic_tokens(n: usize, from: u32, stride: u32) -> Vec<TokenId> {
    (0..n as u32)
        .map(|i| (from + stride * i) % 2000 + 5)
        .collect()
}

/// A new segment of `n` token slots from `pool`.
fn segment(pool: &mut KvPool, n: usize) -> BlockTable {
    let mut t = BlockTable::new();
    t.append_tokens(pool, n).unwrap();
    t
}

/// On tiny Shakespeare (head_dim 64: the `mma.sync` prefill kernel everywhere) and on its shape
/// with head_dim 128 and random weights (on Hopper the warp-specialized kernel:
/// levels started early after the causal prefill or RoPE's store, the decode beside the first).
#[test]
fn cascade_equals_flat_attention_on_the_device() {
    if !have_gpu() {
        return;
    }
    let (config, weights, model) = tiny_shakespeare();
    cascade_equals_flat(&config, &weights, &model, (1e-2, LOGITS_REL_TOL));
    let (config, weights) = shapes::tiny_shakespeare_head_dim_128();
    let model = Model::from_weights(config.clone(), &weights).unwrap();
    // Random weights give flat logits, whose relative errors are larger: on an H100 1.1-1.3e-2
    // cascade against flat, and flat itself 1.2e-2 against the CPU.
    cascade_equals_flat(&config, &weights, &model, (3e-2, RANDOM_LOGITS_REL_TOL));
}

/// [`check`]s three batches; `tol`: the relative errors allowed against flat attention on the
/// GPU and against the CPU.
fn cascade_equals_flat(config: &ModelConfig, weights: &Weights, model: &Model, tol: (f32, f32)) {
    for eager in [false, true] {
        let mut gpu = CudaRunner::new(config, weights, options(64, 8, eager)).unwrap();
        let mut cpu = CascadeCpuRunner::new(CpuRunner::new(model.clone(), 64, 16));
        let mut pool = KvPool::new(64, 16).unwrap();
        let tokens = |n: usize, from: u32| synthetic_tokens(n, from, 37);
        // A system prompt of 56 tokens and a document of 50, both ending in partial pages and
        // each cut in pieces of at least a page (each holds three pages' worth or more).
        let system = segment(&mut pool, 56);
        let doc = segment(&mut pool, 50);
        {
            let mut both: [&mut dyn ModelRunner; 2] = [&mut gpu, &mut cpu];
            prefill_segment(&mut both, &[], &system, &tokens(56, 1));
            prefill_segment(
                &mut both,
                std::slice::from_ref(&system),
                &doc,
                &tokens(50, 2),
            );
        }
        let seq = |id: SeqId, shared: &[&BlockTable], n: usize, pool: &mut KvPool| {
            let mut kv: Vec<BlockTable> = shared.iter().map(|&t| t.clone()).collect();
            kv.push(segment(pool, n));
            ForwardSeq {
                seq_id: id,
                tokens: tokens(n, 3 + id as u32),
                start_pos: shared.iter().map(|t| t.num_tokens()).sum(),
                kv,
                sample: Some(SampleSpec::greedy()),
            }
        };
        // Rows: decodes 1 and 4, then prefills 0, 2 and 3: each group's rows are gathered. The
        // last value: whether the decode folds the first level (its rows are the decode rows).
        let batches = [
            (
                vec![
                    seq(0, &[&system, &doc], 5, &mut pool),
                    seq(1, &[&system, &doc], 1, &mut pool),
                    seq(2, &[&system], 4, &mut pool),
                    seq(3, &[], 6, &mut pool),
                    seq(4, &[&system], 1, &mut pool),
                ],
                [group(&[0, 1, 2, 4], 0), group(&[0, 1], 1)],
                false,
            ),
            // Decodes alone, as a batch of requests sharing a prompt: each group's rows are one
            // run of the step's, read in place by every piece; the decode runs beside the first
            // level's call and folds its pieces in.
            (
                vec![
                    seq(5, &[&system, &doc], 1, &mut pool),
                    seq(6, &[&system, &doc], 1, &mut pool),
                    seq(7, &[&system], 1, &mut pool),
                ],
                [group(&[0, 1, 2], 0), group(&[0, 1], 1)],
                true,
            ),
            // Two groups in one level: the second's queries start two rows into the copy.
            (
                vec![
                    seq(8, &[&system], 1, &mut pool),
                    seq(9, &[&system], 1, &mut pool),
                    seq(10, &[&doc], 1, &mut pool),
                    seq(11, &[&doc], 1, &mut pool),
                ],
                [group(&[0, 1], 0), group(&[2, 3], 0)],
                true,
            ),
        ];
        for (seqs, groups, folds) in batches {
            let batch = ForwardBatch { seqs };
            let plan = StepPlan::new(&batch, &groups, gpu.limits()).unwrap();
            // A planned fold the decode refused would fail the step: the runner makes it an
            // error, so a batch that passes below folded on the device where planned.
            assert_eq!(plan.levels[0].folded, folds, "the first level folded");
            check(&mut gpu, &mut cpu, &batch, &groups, (eager, tol));
        }
    }
}

fn group(seqs: &[usize], segment: usize) -> SharedSegment {
    SharedSegment {
        seqs: seqs.to_vec(),
        segment,
    }
}

/// `batch` on the GPU with the cascade plan it makes (which must be `groups`) against flat
/// attention on the GPU and the cascade on the CPU (relative errors under `flat_tol` and
/// `cpu_tol`).
fn check(
    gpu: &mut CudaRunner,
    cpu: &mut CascadeCpuRunner,
    batch: &ForwardBatch,
    groups: &[SharedSegment],
    (eager, (flat_tol, cpu_tol)): (bool, (f32, f32)),
) {
    assert_eq!(
        plan_cascade(batch),
        groups,
        "the plan the runners make themselves"
    );
    let steps = gpu.cascade_stats().steps;
    let reference = cpu.forward_planned(batch, groups).unwrap();
    let on_flat = gpu.forward_planned(batch, &[]).unwrap();
    let on_cascade = gpu.forward(batch).unwrap();
    assert_eq!(gpu.cascade_stats().steps, steps + 1);
    let (rel, _) = errors(&on_cascade.data, &on_flat.data);
    let (rel_cpu, abs_cpu) = errors(&on_cascade.data, &reference.data);
    let (flat_cpu, _) = errors(&on_flat.data, &reference.data);
    eprintln!(
        "cascade vs flat ({}): relative {rel:.1e}; vs CPU: relative {rel_cpu:.1e}, max abs \
         {abs_cpu:.1e} (flat vs CPU: {flat_cpu:.1e})",
        mode(eager)
    );
    assert!(rel < flat_tol, "cascade and flat differ by {rel:.2e}");
    assert!(rel_cpu < cpu_tol, "cascade vs CPU {rel_cpu:.2e}");
    for i in 0..reference.num_rows() {
        let gap = sampler::top2_gap(reference.row(i));
        if gap > 4.0 * abs_cpu {
            let want = sampler::argmax(reference.row(i));
            assert_eq!(sampler::argmax(on_cascade.row(i)), want, "row {i}");
            assert_eq!(sampler::argmax(on_flat.row(i)), want, "row {i}");
        }
    }
}

/// A few new tokens after a long cached context (the chunk API's cached composition: system
/// prompt and context segments read by one sequence) and the last chunk of a chunked prefill,
/// in one step: their visible KV attended in 2 and in 32 pieces gives the logits of one causal
/// pass (a runner whose pieces may be no shorter than the whole KV) and of the CPU. On tiny
/// Shakespeare (the `mma.sync` prefill kernel) and on its shape at head_dim 128 with random
/// weights (on Hopper the warp-specialized kernel, one 128-row block an SM).
#[test]
fn split_kv_prefill_equals_one_causal_pass_on_the_device() {
    if !have_gpu() {
        return;
    }
    let (config, weights, model) = tiny_shakespeare();
    split_kv_equals_one_pass(&config, &weights, model, (1e-2, LOGITS_REL_TOL));
    let (config, weights) = shapes::tiny_shakespeare_head_dim_128();
    let model = Model::from_weights(config.clone(), &weights).unwrap();
    // Random weights give flat logits, whose relative errors are larger (see the cascade test).
    split_kv_equals_one_pass(&config, &weights, model, (3e-2, RANDOM_LOGITS_REL_TOL));
}

/// The test above on one model; `tol`: the relative errors allowed against one causal pass on
/// the GPU and against the CPU.
fn split_kv_equals_one_pass(
    config: &ModelConfig,
    weights: &Weights,
    model: Model,
    (pass_tol, cpu_tol): (f32, f32),
) {
    let runner = |min_tokens: usize| {
        let options = CudaOptions {
            split_kv_min_tokens: min_tokens,
            ..options(160, 8, true)
        };
        CudaRunner::new(config, weights, options).unwrap()
    };
    let (mut whole, mut coarse, mut fine) = (runner(usize::MAX), runner(256), runner(16));
    let mut cpu = CpuRunner::new(model, 160, 16);
    let mut pool = KvPool::new(160, 16).unwrap();
    let tokens = |n: usize, from: u32| synthetic_tokens(n, from, 43);
    let (system, context) = (segment(&mut pool, 40), segment(&mut pool, 900));
    // The chunked prefill: 876 tokens computed before this step, 24 new in it.
    let chunked = segment(&mut pool, 900);
    let earlier = BlockTable::from_pages(chunked.pages().to_vec(), 876);
    let chunked_tokens = tokens(900, 5);
    {
        let mut all: [&mut dyn ModelRunner; 4] = [&mut whole, &mut coarse, &mut fine, &mut cpu];
        prefill_segment(&mut all, &[], &system, &tokens(40, 1));
        prefill_segment(
            &mut all,
            std::slice::from_ref(&system),
            &context,
            &tokens(900, 2),
        );
        prefill_segment(&mut all, &[], &earlier, &chunked_tokens[..876]);
    }
    let batch = ForwardBatch {
        seqs: vec![
            ForwardSeq {
                seq_id: 0,
                tokens: tokens(16, 3),
                start_pos: 940,
                kv: vec![system.clone(), context.clone(), segment(&mut pool, 16)],
                sample: Some(SampleSpec::greedy()),
            },
            ForwardSeq {
                seq_id: 1,
                tokens: chunked_tokens[876..].to_vec(),
                start_pos: 876,
                kv: vec![chunked.clone()],
                sample: Some(SampleSpec::greedy()),
            },
        ],
    };
    assert!(plan_cascade(&batch).is_empty(), "no cascade group here");
    // The plans the runners make: as many pieces as one wave of the prefill kernel's blocks
    // holds (two 64-row blocks a multiprocessor on `mma.sync`, one of 128 rows on Hopper's), a
    // power of two up to 32; each piece's few queries are one block a KV head.
    let device = kernels::Gpu::open(0).unwrap();
    let kernel = PrefillKernel::best_for(&device, config.head_dim, false);
    let (block_rows, blocks_at_once) = kernel.wave(&device);
    let wave_pieces = blocks_at_once.div_ceil(config.num_kv_heads).min(32);
    let fine_pieces = 1 << (usize::BITS - 1 - wave_pieces.leading_zeros());
    let pieces = |min_tokens: usize| {
        let limits = Limits {
            page_size: 16,
            num_pages: 160,
            vocab_size: config.vocab_size,
            max_position: config.max_position_embeddings,
            max_tokens: 2048,
            max_seqs: 8,
            split: KvSplit {
                block_rows,
                blocks_at_once,
                q_per_kv: config.num_heads / config.num_kv_heads,
                kv_heads: config.num_kv_heads,
                min_tokens,
                decode_beside: kernel.lets_dependents_start(),
                fold_blocks: None,
            },
        };
        let plan = StepPlan::new(&batch, &[], &limits).unwrap();
        plan.levels.iter().map(|l| l.pieces).collect::<Vec<_>>()
    };
    assert_eq!(
        (pieces(usize::MAX), pieces(256), pieces(16)),
        (vec![], vec![2], vec![fine_pieces])
    );
    let reference = cpu.forward(&batch).unwrap();
    let one_pass = whole.forward(&batch).unwrap();
    let (rel_whole, _) = errors(&one_pass.data, &reference.data);
    eprintln!(
        "head_dim {}: one causal pass vs CPU: relative {rel_whole:.1e}",
        config.head_dim
    );
    let fine_label = format!("{fine_pieces} pieces");
    for (label, gpu) in [("2 pieces", &mut coarse), (fine_label.as_str(), &mut fine)] {
        let split = gpu.forward(&batch).unwrap();
        let (rel, _) = errors(&split.data, &one_pass.data);
        let (rel_cpu, abs_cpu) = errors(&split.data, &reference.data);
        eprintln!(
            "split-KV in {label} vs one pass: relative {rel:.1e}; vs CPU: relative {rel_cpu:.1e}, max abs {abs_cpu:.1e}"
        );
        assert!(rel < pass_tol, "{label} and one pass differ by {rel:.2e}");
        assert!(rel_cpu < cpu_tol, "{label} vs CPU {rel_cpu:.2e}");
        for i in 0..reference.num_rows() {
            if sampler::top2_gap(reference.row(i)) > 4.0 * abs_cpu {
                let want = sampler::argmax(reference.row(i));
                assert_eq!(sampler::argmax(split.row(i)), want, "{label}, row {i}");
            }
        }
    }
}

#[test]
fn copy_kv_with_a_rope_shift_follows_the_cpu_runner() {
    if !have_gpu() {
        return;
    }
    let (config, weights, model) = tiny_shakespeare();
    let mut gpu = CudaRunner::new(&config, &weights, options(64, 8, true)).unwrap();
    let mut cpu = CascadeCpuRunner::new(CpuRunner::new(model, 64, 16));
    let mut pool = KvPool::new(64, 16).unwrap();
    let tokens = |n: usize, from: u32| synthetic_tokens(n, from, 41);
    // A 30-token prefix, and a 40-token context prefilled on its own at position 0, then moved
    // behind the prefix (the chunk API's independent mode): once turned by 30 positions, and
    // once not turned, which must come out measurably wrong.
    let (prefix, own) = (segment(&mut pool, 30), segment(&mut pool, 40));
    let (moved, unturned) = (segment(&mut pool, 40), segment(&mut pool, 40));
    {
        let mut both: [&mut dyn ModelRunner; 2] = [&mut gpu, &mut cpu];
        prefill_segment(&mut both, &[], &prefix, &tokens(30, 1));
        prefill_segment(&mut both, &[], &own, &tokens(40, 2));
    }
    cpu.copy_kv(&own, &moved, 30).unwrap();
    gpu.copy_kv(&own, &moved, 30).unwrap();
    gpu.copy_kv(&own, &unturned, 0).unwrap();
    let after = |context: &BlockTable, pool: &mut KvPool| ForwardSeq {
        seq_id: 0,
        tokens: tokens(3, 3),
        start_pos: 70,
        kv: vec![prefix.clone(), context.clone(), segment(pool, 3)],
        sample: Some(SampleSpec::greedy()),
    };
    let seq = after(&moved, &mut pool);
    let reference = cpu.forward(&one(&seq)).unwrap();
    let on_gpu = gpu.forward(&one(&seq)).unwrap();
    let wrong = gpu.forward(&one(&after(&unturned, &mut pool))).unwrap();
    let (rel, abs) = errors(&on_gpu.data, &reference.data);
    let (rel_wrong, _) = errors(&wrong.data, &reference.data);
    eprintln!("moved K/V vs CPU: relative {rel:.1e}; without the turn: {rel_wrong:.1e}");
    assert!(rel < LOGITS_REL_TOL, "device copy_kv vs CPU: {rel:.2e}");
    assert!(
        rel_wrong > 3.0 * rel,
        "the test cannot see the rotation: {rel_wrong:.2e} vs {rel:.2e}"
    );
    if sampler::top2_gap(reference.row(0)) > 4.0 * abs {
        assert_eq!(
            sampler::argmax(on_gpu.row(0)),
            sampler::argmax(reference.row(0))
        );
    }

    // Refused: a copy that reads and writes the same page, or into a segment of another length.
    assert!(gpu.copy_kv(&own, &own, 5).is_err());
    assert!(gpu.copy_kv(&own, &prefix, 5).is_err());
}

#[test]
fn device_sampling_follows_the_host_sampler_on_the_same_logits() {
    if !have_gpu() {
        return;
    }
    let (config, weights, _) = tiny_shakespeare();
    let mut gpu = CudaRunner::new(&config, &weights, options(64, 8, false)).unwrap();
    let mut pool = KvPool::new(64, 16).unwrap();
    let specs = [
        (0.0, -1, 1.0),
        (1.0, -1, 1.0),
        (0.7, 40, 1.0),
        (0.8, -1, 0.9),
        (1.3, 20, 0.8),
    ];
    for n in [7, 1] {
        let seqs: Vec<ForwardSeq> = specs
            .iter()
            .enumerate()
            .map(|(i, &(temperature, top_k, top_p))| {
                let mut kv = BlockTable::new();
                kv.append_tokens(&mut pool, n).unwrap();
                ForwardSeq {
                    seq_id: i as SeqId,
                    tokens: (0..n as u32).map(|t| 11 * t + 3 * i as u32 + 1).collect(),
                    start_pos: 0,
                    kv: vec![kv],
                    sample: Some(SampleSpec {
                        temperature,
                        top_k,
                        top_p,
                        seed: 1234 + i as u64,
                        step: n as u64,
                    }),
                }
            })
            .collect();
        let batch = ForwardBatch { seqs };
        let logits: Logits = gpu.forward(&batch).unwrap();
        let want: Vec<TokenId> = batch
            .seqs
            .iter()
            .enumerate()
            .map(|(i, s)| sampler::sample(logits.row(i), &s.sample.unwrap()))
            .collect();
        assert_eq!(
            gpu.forward_sample(&batch).unwrap(),
            want,
            "{n}-token sequences"
        );
        for mut s in batch.seqs {
            s.kv[0].release(&mut pool).unwrap();
        }
    }
}

#[test]
fn bad_batches_are_errors_on_the_device() {
    if !have_gpu() {
        return;
    }
    let (config, weights, _) = tiny_shakespeare();
    let mut gpu = CudaRunner::new(&config, &weights, options(8, 4, false)).unwrap();
    let seq = |token: TokenId, page: u32| ForwardSeq {
        seq_id: 0,
        tokens: vec![token],
        start_pos: 0,
        kv: vec![BlockTable::from_pages(vec![page], 1)],
        sample: Some(SampleSpec::greedy()),
    };
    for (s, needle) in [
        (seq(5000, 0), "vocabulary"),
        (seq(5, 8), "outside the store"),
    ] {
        let err = gpu.forward_sample(&one(&s)).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidBatch(m) if m.contains(needle)),
            "{err}"
        );
    }
    // Still serving afterwards.
    assert_eq!(gpu.forward_sample(&one(&seq(5, 0))).unwrap().len(), 1);
}

/// Runs every prompt to completion together, greedy, `max_tokens` each (see [`run_requests`]).
fn run_engine(
    runner: &mut Option<CudaRunner>,
    prompts: &[Vec<TokenId>],
    max_tokens: usize,
    config: SchedulerConfig,
) -> Vec<Vec<TokenId>> {
    let params = SamplingParams::greedy()
        .with_max_tokens(max_tokens)
        .with_ignore_eos(true);
    let requests: Vec<_> = prompts
        .iter()
        .map(|p| (p.clone(), params.clone()))
        .collect();
    run_requests(runner, &requests, vec![], config, false)
}

/// Runs `requests` (each with its own sampling) to completion together, overlapped or not;
/// outputs in request order, after checking that each finished once and every page came back.
/// The engine borrows the runner from `slot` and puts it back.
fn run_requests(
    slot: &mut Option<CudaRunner>,
    requests: &[(Vec<TokenId>, SamplingParams)],
    eos: Vec<TokenId>,
    config: SchedulerConfig,
    overlap: bool,
) -> Vec<Vec<TokenId>> {
    let runner = slot.take().expect("a runner to lend");
    let pages = runner.num_pages();
    let mut engine = Engine::new(runner, config, eos, 7).unwrap();
    let ids: Vec<SeqId> = requests
        .iter()
        .map(|(p, params)| engine.add_request(p.clone(), params.clone()).unwrap())
        .collect();
    let mut done = match overlap {
        true => Overlap::new(true).run_to_completion(&mut engine, |r| r),
        false => engine.run_to_completion(),
    }
    .unwrap();
    assert_eq!(done.len(), requests.len(), "every request finished once");
    done.sort_by_key(|f| ids.iter().position(|&id| id == f.id));
    engine.scheduler_mut().clear_cache();
    assert_eq!(
        engine.scheduler().pool().num_free(),
        pages,
        "every page back"
    );
    *slot = Some(engine.into_runner());
    done.into_iter().map(|f| f.output).collect()
}

#[test]
fn engine_batched_equals_alone_and_a_tiny_pool_preempts() {
    if !have_gpu() {
        return;
    }
    let (config, weights, model) = tiny_shakespeare();
    let (_, cases) = read_fixture(&models_dir().join("fixtures/tiny-shakespeare.json"));
    // Six prompts, three of them behind the same 40-token system prompt (the prefix cache
    // then hands them shared segments).
    let system = &cases.iter().find(|c| c.prompt.len() >= 200).unwrap().prompt[..40];
    let mut prompts: Vec<Vec<TokenId>> = Vec::new();
    for c in cases.iter().filter(|c| c.prompt.len() <= 130).take(6) {
        let mut p = if prompts.len().is_multiple_of(2) {
            system.to_vec()
        } else {
            Vec::new()
        };
        p.extend_from_slice(&c.prompt);
        prompts.push(p);
    }
    let max_tokens = 24;
    let sched = |max_num_batched_tokens: usize, max_num_seqs: usize, chunk: Option<usize>| {
        SchedulerConfig {
            max_num_batched_tokens,
            max_num_seqs,
            chunk_size: chunk,
            enable_prefix_caching: true,
            batching: Batching::Continuous,
            max_model_len: 2048,
        }
    };

    let mut gpu = Some(CudaRunner::new(&config, &weights, options(128, 6, false)).unwrap());
    let mut cpu = CpuRunner::new(model, 128, 16);
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let reference = greedy(&mut cpu, p, max_tokens, false);
        let prefill = greedy(gpu.as_mut().unwrap(), p, 1, false);
        let (_, abs) = errors(&prefill.first_logits, &reference.first_logits);
        let tol = 4.0 * abs;
        let out = run_engine(
            &mut gpu,
            std::slice::from_ref(p),
            max_tokens,
            sched(2048, 1, None),
        )
        .remove(0);
        let n = agree(
            &format!("prompt {i} alone"),
            &out,
            &reference.tokens,
            &reference.gaps,
            tol,
        );
        eprintln!(
            "prompt {i} ({} tokens) alone: {n}/{max_tokens} equal to the CPU (tolerance {tol:.2e})",
            p.len()
        );
        alone.push((out, reference, tol));
    }

    let batched = run_engine(&mut gpu, &prompts, max_tokens, sched(64, 6, Some(16)));
    // Pages for the longest request alone and a little more: decodes run out and preempt.
    let longest = prompts.iter().map(Vec::len).max().unwrap() + max_tokens;
    let mut tiny = Some(
        CudaRunner::new(
            &config,
            &weights,
            options(longest.div_ceil(16) + 2, 6, false),
        )
        .unwrap(),
    );
    let squeezed = run_engine(&mut tiny, &prompts, max_tokens, sched(64, 6, Some(16)));
    for (i, (out, reference, tol)) in alone.iter().enumerate() {
        let same = batched[i]
            .iter()
            .zip(out)
            .take_while(|(a, b)| a == b)
            .count();
        agree(
            &format!("prompt {i} batched"),
            &batched[i],
            &reference.tokens,
            &reference.gaps,
            *tol,
        );
        agree(
            &format!("prompt {i} tiny pool"),
            &squeezed[i],
            &reference.tokens,
            &reference.gaps,
            *tol,
        );
        let same_tiny = squeezed[i]
            .iter()
            .zip(&batched[i])
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "prompt {i}: batched equals alone for {same}/{max_tokens} tokens, tiny pool equals batched for {same_tiny}/{max_tokens}"
        );
        assert_eq!(squeezed[i].len(), max_tokens, "prompt {i} finished");
    }
}

/// [`run_requests`] with the scheduler of the overlap test: 8 seats, 64-token chunks.
fn run_mixed(
    runner: &mut Option<CudaRunner>,
    prompts: &[(Vec<TokenId>, SamplingParams)],
    eos: Vec<TokenId>,
    overlap: bool,
) -> Vec<Vec<TokenId>> {
    let config = SchedulerConfig {
        max_num_batched_tokens: 256,
        max_num_seqs: 8,
        chunk_size: Some(64),
        enable_prefix_caching: true,
        batching: Batching::Continuous,
        max_model_len: 2048,
    };
    run_requests(runner, prompts, eos, config, overlap)
}

#[test]
fn overlap_scheduling_gives_the_same_tokens_on_the_device() {
    if !have_gpu() {
        return;
    }
    let (config, weights, _) = tiny_shakespeare();
    let (_, cases) = read_fixture(&models_dir().join("fixtures/tiny-shakespeare.json"));
    // Eight prompts, greedy and seeded sampling, each stopping at its own length.
    let prompts: Vec<(Vec<TokenId>, SamplingParams)> = cases
        .iter()
        .take(8)
        .enumerate()
        .map(|(i, c)| {
            let params = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams::default()
                    .with_temperature(0.8)
                    .with_seed(i as u64)
            };
            let params = params.with_max_tokens(10 + 7 * i).with_ignore_eos(true);
            (c.prompt.clone(), params)
        })
        .collect();
    for eager in [false, true] {
        let mut gpu = Some(CudaRunner::new(&config, &weights, options(256, 8, eager)).unwrap());
        let sync = run_mixed(&mut gpu, &prompts, vec![], false);
        let overlapped = run_mixed(&mut gpu, &prompts, vec![], true);
        // Lengths are known ahead, so both runs compute the same batches: the same kernels on
        // the same rows give the same bits.
        assert_eq!(overlapped, sync, "{}", mode(eager));
        for (out, (_, params)) in overlapped.iter().zip(&prompts) {
            assert_eq!(out.len(), params.max_tokens);
        }
        // Stopping on a frequent token: sequences stop where the engine only learns it a step
        // later, so a step computes them once more and drops that token.
        let with_eos: Vec<(Vec<TokenId>, SamplingParams)> = prompts
            .iter()
            .map(|(p, params)| (p.clone(), params.clone().with_ignore_eos(false)))
            .collect();
        let eos: Vec<TokenId> = (0..20).collect();
        let sync = run_mixed(&mut gpu, &with_eos, eos.clone(), false);
        let overlapped = run_mixed(&mut gpu, &with_eos, eos.clone(), true);
        for (i, (a, b)) in overlapped.iter().zip(&sync).enumerate() {
            let same = a.iter().zip(b).take_while(|(x, y)| x == y).count();
            eprintln!(
                "{} prompt {i}: overlapped {} tokens, one at a time {}, equal for {same}",
                mode(eager),
                a.len(),
                b.len()
            );
            assert!(a.len() <= prompts[i].1.max_tokens);
            if a.len() < prompts[i].1.max_tokens {
                assert!(eos.contains(a.last().unwrap()), "stopped on EOS");
            }
        }
    }
}
