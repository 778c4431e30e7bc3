//! Generates text from the embedded tiny Shakespeare model on the CPU, showing each step:
//! one prefill step for the prompts, then decode steps of one token per sequence.
//!
//! `cargo run --release -p phase2 --example generate -- "ROMEO:" "JULIET:"`

use std::time::Instant;

use phase0::{Request, SamplingParams, Sequence};
use phase1::KvPool;
use phase2::{
    CpuRunner, DecodeManager, ForwardBatch, Model, ModelRunner, PrefillConfig, PrefillManager,
    SeqState, Tokenizer,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = phase2::default_model_dir();
    let mut prompts: Vec<String> = std::env::args().skip(1).collect();
    if prompts.is_empty() {
        prompts = vec!["ROMEO:".into(), "JULIET:\nO Romeo".into()];
    }
    let model = Model::load(&dir)?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let (num_pages, page_size) = (64, 16);
    let mut runner = CpuRunner::new(model, num_pages, page_size);
    let mut pool = KvPool::new(num_pages, page_size)?;
    let mut prefill = PrefillManager::new(PrefillConfig::default());
    let mut decode = DecodeManager::new();

    let params = SamplingParams::default()
        .with_temperature(0.8)
        .with_top_k(40)
        .with_max_tokens(40);
    for (i, p) in prompts.iter().enumerate() {
        let ids = tokenizer.encode(p)?;
        let seq = Sequence::new(Request::new(
            i as u64,
            ids,
            params.clone().with_seed(i as u64),
        ))?;
        prefill.add(SeqState::new(seq, i as u64))?;
    }

    let mut step = 0;
    while prefill.num_waiting() + decode.num_running() > 0 {
        step += 1;
        // Prefill first (nano-vllm's policy): admitted prompts run whole in one step.
        let admitted = prefill.schedule(&mut pool, decode.num_running());
        let (kind, batch) = if !admitted.is_empty() {
            let batch = ForwardBatch {
                seqs: admitted
                    .iter()
                    .map(|s| s.forward_seq(s.num_uncomputed()))
                    .collect(),
            };
            for mut s in admitted {
                s.seq.start()?;
                decode.add(s);
            }
            ("prefill", batch)
        } else {
            let plan = decode.schedule(&mut pool);
            if !plan.blocked.is_empty() {
                return Err("out of KV pages (chapter 5 preempts instead)".into());
            }
            let seqs = decode.running().iter().map(|s| s.forward_seq(1)).collect();
            ("decode", ForwardBatch { seqs })
        };
        let start = Instant::now();
        let tokens = runner.forward_sample(&batch)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        // Every sequence of the batch sampled: record the computed tokens and the new one.
        for (fs, token) in batch.seqs.iter().zip(tokens) {
            let state = decode
                .running_mut()
                .iter_mut()
                .find(|s| s.id() == fs.seq_id)
                .expect("running");
            state.num_computed += fs.tokens.len();
            state.seq.append_token(token, tokenizer.eos_token_ids())?;
        }
        if step <= 3 || kind == "prefill" {
            println!(
                "step {step:>2}: {kind:<7} {} sequences, {:>3} tokens, {ms:6.2} ms, {} of {} pages used",
                batch.seqs.len(),
                batch.num_tokens(),
                pool.num_used(),
                pool.num_pages()
            );
        }
        for mut done in decode.take_finished() {
            done.release(&mut pool)?;
            let text = tokenizer.decode(done.seq.output(), true)?;
            println!(
                "\n--- request {} finished ({}) after step {step} ---\n{}{}\n",
                done.id(),
                done.seq.finish_reason().expect("finished"),
                prompts[done.id() as usize],
                text
            );
        }
    }
    println!(
        "{step} steps; {} of {} pages free at the end",
        pool.num_free(),
        pool.num_pages()
    );
    Ok(())
}
