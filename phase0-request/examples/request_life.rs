//! Chapter 0, "Try it": one request's life in the engine's terms. Its parameters are checked,
//! it becomes a sequence that starts, is preempted, starts again and stops on a stop id, and
//! a step's batch prints as the one-line trace later chapters use.

use phase0::{Batch, Request, SamplingParams, Sequence};

fn main() -> Result<(), phase0::Error> {
    let bad = SamplingParams::default().with_top_p(0.0);
    println!("refused: {}", bad.validate().unwrap_err());

    let params = SamplingParams::greedy()
        .with_max_tokens(8)
        .with_stop_token_ids(vec![9]);
    let mut seq = Sequence::new(Request::new(1, vec![5, 6, 7], params))?;
    let eos = [0];
    println!("sequence 1, prompt {:?}: {}", seq.prompt(), seq.status());
    seq.start()?;
    println!("start        -> {}", seq.status());
    for token in [11, 12] {
        seq.append_token(token, &eos)?;
        println!(
            "append {token:<5} -> {}, output {:?}",
            seq.status(),
            seq.output()
        );
    }
    seq.preempt()?;
    println!(
        "preempt      -> {}, {} tokens kept for recomputation",
        seq.status(),
        seq.len()
    );
    seq.start()?;
    println!("start        -> {}", seq.status());
    seq.append_token(9, &eos)?;
    println!(
        "append 9     -> {}, output {:?} (the stop id stays in the output)",
        seq.status(),
        seq.output()
    );
    if let Err(e) = seq.append_token(13, &eos) {
        println!("append 13    -> refused: {e}");
    }

    let mut batch = Batch::new();
    batch.push_prefill(1, 0, 12);
    batch.push_prefill(2, 16, 30);
    batch.push_decode(3);
    batch.push_decode(4);
    println!(
        "\none step: {batch}  ({} prefill + {} decode tokens)",
        batch.num_prefill_tokens(),
        batch.num_decode_tokens()
    );
    Ok(())
}
