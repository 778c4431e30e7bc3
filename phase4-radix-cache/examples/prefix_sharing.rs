//! What the radix cache buys on the embedded model (CPU): 24 requests that share three system
//! prompts with few-shot examples, arriving in waves; hit rate and prefill time with and
//! without the cache.
//!
//! `cargo run --release -p phase4 --example prefix_sharing`

use std::time::Instant;

use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::{CpuRunner, Model, SeqState, Tokenizer};
use phase3::{ChunkedPrefillConfig, ChunkedScheduler, PrefixCache};
use phase4::RadixCache;

const PAGE: usize = 16;
const PAGES: usize = 1024;

struct Outcome {
    prefill_tokens: usize,
    prefill_seconds: f64,
    total_seconds: f64,
    outputs: Vec<Vec<u32>>,
}

fn run<C: PrefixCache>(
    s: &mut ChunkedScheduler<C>,
    runner: &mut CpuRunner,
    waves: &[Vec<Vec<u32>>],
) -> Outcome {
    let mut out = Outcome {
        prefill_tokens: 0,
        prefill_seconds: 0.0,
        total_seconds: 0.0,
        outputs: Vec::new(),
    };
    let start = Instant::now();
    let mut id = 0;
    let mut finished = Vec::new();
    for wave in waves {
        for prompt in wave {
            let params = SamplingParams::greedy()
                .with_max_tokens(16)
                .with_ignore_eos(true);
            s.add(SeqState::new(
                Sequence::new(Request::new(id, prompt.clone(), params)).unwrap(),
                0,
            ));
            id += 1;
        }
        while s.has_work() {
            let t = Instant::now();
            let step = s.step(runner).unwrap();
            if step.plan.num_prefill_tokens() > 0 {
                out.prefill_tokens += step.plan.num_prefill_tokens();
                out.prefill_seconds += t.elapsed().as_secs_f64();
            }
            finished.extend(
                step.finished
                    .into_iter()
                    .map(|f| (f.id(), f.seq.output().to_vec())),
            );
        }
    }
    finished.sort();
    out.outputs = finished.into_iter().map(|(_, o)| o).collect();
    out.total_seconds = start.elapsed().as_secs_f64();
    out
}

fn main() {
    let dir = phase2::default_model_dir();
    let model = Model::load(&dir).expect("the embedded model loads");
    let tok = Tokenizer::from_dir(&dir).expect("its tokenizer loads");
    let systems = [
        "You are a player in a company of actors. Answer every question in the voice of a Shakespearean king, with the pride and the doubt of one who wears a crown.",
        "You are a nurse in Verona. Answer every question at length, with gossip, proverbs and memories of the old days, as the Nurse of Romeo and Juliet would.",
        "You are a fool at court. Answer every question with a riddle, a pun and a song, and never give a straight answer.",
    ];
    let shots = "\n\nFirst Citizen:\nWhat news?\n\nMessenger:\nThe king is coming, my lord, with all his train.\n\nFirst Citizen:\nAnd what of the queen?\n\nMessenger:\nShe follows after, weeping.\n";
    let questions = [
        "What is love?",
        "Where is the king?",
        "Who comes here?",
        "What news from Rome?",
        "Shall we fight?",
        "Is the queen well?",
        "What hour is it?",
        "Why do you weep?",
    ];
    let prompt = |s: &str, q: &str| {
        tok.encode(&format!("{s}{shots}\nSecond Citizen:\n{q}\n\nMessenger:\n"))
            .unwrap()
    };
    // Three waves of eight: each wave asks every system prompt a few questions.
    let waves: Vec<Vec<Vec<u32>>> = (0..3)
        .map(|w| {
            (0..8)
                .map(|i| prompt(systems[(i + w) % 3], questions[(i * 3 + w) % 8]))
                .collect()
        })
        .collect();
    let prompt_tokens: usize = waves.iter().flatten().map(Vec::len).sum();
    let config = ChunkedPrefillConfig {
        max_num_batched_tokens: 4096,
        max_num_seqs: 16,
        chunk_size: 4096,
    };

    let mut runner = CpuRunner::new(model.clone(), PAGES, PAGE);
    let mut plain = ChunkedScheduler::new(KvPool::new(PAGES, PAGE).unwrap(), config, vec![]);
    let without = run(&mut plain, &mut runner, &waves);

    let mut runner = CpuRunner::new(model, PAGES, PAGE);
    let mut cached = ChunkedScheduler::with_cache(
        KvPool::new(PAGES, PAGE).unwrap(),
        config,
        vec![],
        RadixCache::new(PAGE),
    );
    let with = run(&mut cached, &mut runner, &waves);
    assert_eq!(with.outputs, without.outputs, "the cache changes no token");
    let stats = cached.cache.stats();

    println!(
        "24 requests, {prompt_tokens} prompt tokens, 3 system prompts with few-shot examples, page size {PAGE}\n"
    );
    println!("| | prefill tokens computed | prefill time | total time |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| no cache | {} | {:.2} s | {:.2} s |",
        without.prefill_tokens, without.prefill_seconds, without.total_seconds
    );
    println!(
        "| radix cache | {} | {:.2} s | {:.2} s |",
        with.prefill_tokens, with.prefill_seconds, with.total_seconds
    );
    println!("\ncache: {stats}");
    println!("\n{}", cached.cache.tree());
}
