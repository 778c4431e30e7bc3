//! Exercise 2.2: a generation loop of your own, with a repetition penalty.
//!
//! Build: [`generate`], which runs one prompt on any [`ModelRunner`] the way the engine does:
//! a block table in a [`KvPool`], one prefill step for the whole prompt, then one decode step
//! per new token, each reserving its slot first; the caller's `choose` picks every token from
//! the logits. And [`apply_repetition_penalty`], the logits rule `choose` can apply first.
//!
//! Why: until now a scheduler built every batch; writing the loop by hand shows what a
//! [`ForwardSeq`] must say (tokens, their position, the pages, whether to sample) and that
//! the K/V of earlier steps is simply read back from the pages. Small models fall into loops
//! ("the the the"); the penalty from the CTRL paper (Hugging Face's and vLLM's
//! `repetition_penalty`) makes every token already in the text less likely.
//!
//! Checked by `cargo test -p phase2 --features exercises --test exercises repetition_penalty`.

use phase0::TokenId;
use phase1::{BlockTable, KvPool};

use crate::{Error, ForwardBatch, ForwardSeq, ModelRunner, SampleSpec};

/// Makes each distinct token of `seen` less likely: a positive logit is divided by
/// `penalty`, a negative one multiplied (dividing a negative logit would raise it). A token
/// seen twice is penalised once. `penalty == 1` changes nothing; ids outside `logits` are
/// skipped.
pub fn apply_repetition_penalty(logits: &mut [f32], seen: &[TokenId], penalty: f32) {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.2: lower the logits of tokens already seen, once each");
    }
    // BEGIN SOLUTION
    let mut done = std::collections::HashSet::new();
    for &t in seen {
        if !done.insert(t) {
            continue;
        }
        if let Some(x) = logits.get_mut(t as usize) {
            *x = if *x > 0.0 { *x / penalty } else { *x * penalty };
        }
    }
    // END SOLUTION
}

/// Generates `max_tokens` tokens after `prompt` (which must not be empty) on `runner`, with
/// the K/V in pages of a pool as large as the runner's storage. Each step `choose` gets the
/// sampled row of logits (it may change them) and the tokens generated so far, and returns
/// the next token. The pool lives as long as the call: its pages say where the K/V is.
pub fn generate(
    runner: &mut dyn ModelRunner,
    prompt: &[TokenId],
    max_tokens: usize,
    mut choose: impl FnMut(&mut [f32], &[TokenId]) -> TokenId,
) -> Result<Vec<TokenId>, Error> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 2.2: prefill the prompt, then decode token by token over a block table");
    }
    // BEGIN SOLUTION
    let mut pool = KvPool::new(runner.num_pages(), runner.page_size())?;
    let mut table = BlockTable::new();
    table.append_tokens(&mut pool, prompt.len())?;
    let (mut tokens, mut start_pos) = (prompt.to_vec(), 0);
    let mut output = Vec::with_capacity(max_tokens);
    while output.len() < max_tokens {
        let step = ForwardBatch {
            seqs: vec![ForwardSeq {
                seq_id: 0,
                tokens,
                start_pos,
                kv: vec![table.clone()],
                sample: Some(SampleSpec::greedy()),
            }],
        };
        let mut row = runner.forward(&step)?.row(0).to_vec();
        let next = choose(&mut row, &output);
        output.push(next);
        // The new token's K/V is written by the next step, into a slot reserved now.
        start_pos = table.num_tokens();
        tokens = vec![next];
        if output.len() < max_tokens {
            table.append_slot(&mut pool)?;
        }
    }
    Ok(output)
    // END SOLUTION
}
