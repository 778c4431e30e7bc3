//! How far the independent composition mode drifts from the exact one, on the embedded model.
//!
//! Exact: the contexts' K/V is computed after the system prompt and the contexts before them.
//! Independent: each context's K/V is computed on its own at position 0 and its keys turned to
//! the position where it is placed (exact for RoPE); what is lost is the contexts' attention to
//! what precedes them. For several compositions this runs the exact greedy continuation, then
//! feeds the same tokens through the independent K/V and reports how often the independent
//! argmax agrees and the mean |difference| of the chosen tokens' log-probabilities.
//!
//! `cargo run --release -p phase6-chunks --example independent_drift`

use phase1::{BlockTable, KvPool};
use phase2::{
    CpuRunner, ForwardBatch, ForwardSeq, Model, ModelRunner, SampleSpec, Tokenizer, sampler::argmax,
};
use phase6_chunks::{CascadeCpuRunner, ChunkRunner};

const STEPS: usize = 24;
const PAGES: usize = 512;
const PAGE: usize = 16;

fn log_softmax_at(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|x| (x - max).exp()).sum();
    logits[token as usize] - max - sum.ln()
}

/// Runs `tokens` after `segments` (new pages) and returns the last logits and the segment.
fn run(
    runner: &mut CascadeCpuRunner,
    pool: &mut KvPool,
    segments: &[BlockTable],
    tokens: &[u32],
    sample: bool,
) -> (Vec<f32>, BlockTable) {
    let start: usize = segments.iter().map(BlockTable::num_tokens).sum();
    let mut own = BlockTable::new();
    own.append_tokens(pool, tokens.len()).unwrap();
    let mut kv = segments.to_vec();
    kv.push(own.clone());
    let seq = ForwardSeq {
        seq_id: 0,
        tokens: tokens.to_vec(),
        start_pos: start,
        kv,
        sample: sample.then(SampleSpec::greedy),
    };
    let logits = runner.forward(&ForwardBatch { seqs: vec![seq] }).unwrap();
    (logits.data, own)
}

/// Teacher-forces `continuation` after `prompt` on `segments`: per step, the log-probability of
/// the forced token and the argmax.
fn score(
    runner: &mut CascadeCpuRunner,
    pool: &mut KvPool,
    mut segments: Vec<BlockTable>,
    prompt: &[u32],
    continuation: &[u32],
) -> Vec<(f32, u32)> {
    let (mut logits, seg) = run(runner, pool, &segments, prompt, true);
    segments.push(seg);
    let mut out = Vec::new();
    for &t in continuation {
        out.push((log_softmax_at(&logits, t), argmax(&logits)));
        let (l, seg) = run(runner, pool, &segments, &[t], true);
        segments.push(seg);
        logits = l;
    }
    out
}

fn main() {
    let dir = phase6::default_model_dir();
    let model = Model::load(&dir).expect("the embedded model loads");
    let tok = Tokenizer::from_dir(&dir).expect("its tokenizer loads");
    let mut runner = CascadeCpuRunner::new(CpuRunner::new(model, PAGES, PAGE));
    let enc = |s: &str| tok.encode(s).unwrap();
    let system = enc("You are the Chorus. Tell the story of Verona in verse.\n");
    let contexts = [
        enc("Two households, both alike in dignity,\nIn fair Verona, where we lay our scene,\n"),
        enc(
            "From ancient grudge break to new mutiny,\nWhere civil blood makes civil hands unclean.\n",
        ),
        enc(
            "A pair of star-cross'd lovers take their life;\nWhose misadventured piteous overthrows\n",
        ),
    ];
    let query = enc("CHORUS:\n");
    let orders: [&[usize]; 5] = [&[0], &[1], &[0, 1], &[1, 0], &[0, 1, 2]];

    println!("| contexts | prompt tokens | greedy agreement | mean abs. log-prob difference |");
    println!("| --- | --- | --- | --- |");
    let (mut agree_all, mut diff_all, mut n_all) = (0usize, 0f32, 0usize);
    for order in orders {
        let mut pool = KvPool::new(PAGES, PAGE).unwrap();
        // Exact: one prefill of everything, then greedy decoding.
        let mut prompt = system.clone();
        for &c in order {
            prompt.extend(&contexts[c]);
        }
        prompt.extend(&query);
        let (mut logits, seg) = run(&mut runner, &mut pool, &[], &prompt, true);
        let mut segs = vec![seg];
        let mut exact = Vec::new();
        let mut exact_lp = Vec::new();
        for _ in 0..STEPS {
            let t = argmax(&logits);
            exact_lp.push(log_softmax_at(&logits, t));
            exact.push(t);
            let (l, s) = run(&mut runner, &mut pool, &segs, &[t], true);
            segs.push(s);
            logits = l;
        }
        // Independent: system at 0, each context on its own at 0, keys turned into place.
        let (_, sys_kv) = run(&mut runner, &mut pool, &[], &system, false);
        let mut segments = vec![sys_kv];
        let mut offset = system.len();
        for &c in order {
            let (_, own) = run(&mut runner, &mut pool, &[], &contexts[c], false);
            let mut moved = BlockTable::new();
            moved.append_tokens(&mut pool, own.num_tokens()).unwrap();
            runner.copy_kv(&own, &moved, offset as i64).unwrap();
            segments.push(moved);
            offset += contexts[c].len();
        }
        let scored = score(&mut runner, &mut pool, segments, &query, &exact);
        let agree = scored
            .iter()
            .zip(&exact)
            .filter(|((_, am), t)| am == *t)
            .count();
        let diff: f32 = scored
            .iter()
            .zip(&exact_lp)
            .map(|((lp, _), e)| (lp - e).abs())
            .sum();
        agree_all += agree;
        diff_all += diff;
        n_all += STEPS;
        let names: Vec<String> = order.iter().map(|c| format!("C{}", c + 1)).collect();
        println!(
            "| {} | {} | {}/{STEPS} ({:.0}%) | {:.3} |",
            names.join(", "),
            prompt.len(),
            agree,
            100.0 * agree as f64 / STEPS as f64,
            diff / STEPS as f32
        );
    }
    println!(
        "\noverall: greedy agreement {:.0}%, mean |delta log-prob| {:.3} over {n_all} teacher-forced tokens",
        100.0 * agree_all as f64 / n_all as f64,
        diff_all / n_all as f32
    );
}
