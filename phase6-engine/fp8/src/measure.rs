//! Chapter 6.6: measuring what an FP8 K/V cache costs: the same steps on two runners, compared.
//!
//! The accuracy example (`cargo run -p phase6-fp8 --release --example accuracy`) and the
//! chapter's tests drive runners through these: prefill logits, greedy continuations and the
//! log-likelihood of a text, each sequence on its own pages of the runner's store.

use phase0::TokenId;
use phase1::{BlockTable, KvPool};
pub use phase2::sampler::argmax;
use phase2::{Error, ForwardBatch, ForwardSeq, ModelRunner, SampleSpec};

/// `‖a − b‖ / ‖b‖`: the size of the error relative to the size of the reference `b`.
pub fn rel_error(a: &[f32], b: &[f32]) -> f32 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt() as f32
}

/// Sequences run step by step on one runner, every step sampled (logits for each).
pub struct Sequences<'a> {
    runner: &'a mut dyn ModelRunner,
    pool: KvPool,
    tables: Vec<BlockTable>,
}

impl<'a> Sequences<'a> {
    /// `n` empty sequences on `runner`'s pages.
    pub fn new(runner: &'a mut dyn ModelRunner, n: usize) -> Result<Self, Error> {
        let pool = KvPool::new(runner.num_pages(), runner.page_size())?;
        Ok(Self {
            runner,
            pool,
            tables: vec![BlockTable::new(); n],
        })
    }

    /// Runs `tokens[i]` (a prompt piece or one token) after what sequence `i` holds; returns
    /// each sequence's logits for its next token.
    pub fn step(&mut self, tokens: &[Vec<TokenId>]) -> Result<Vec<Vec<f32>>, Error> {
        let mut seqs = Vec::with_capacity(tokens.len());
        for (i, (table, t)) in self.tables.iter_mut().zip(tokens).enumerate() {
            let start_pos = table.num_tokens();
            table.append_tokens(&mut self.pool, t.len())?;
            seqs.push(ForwardSeq {
                seq_id: i as u64,
                tokens: t.clone(),
                start_pos,
                kv: vec![table.clone()],
                sample: Some(SampleSpec::greedy()),
            });
        }
        let logits = self.runner.forward(&ForwardBatch { seqs })?;
        Ok((0..logits.num_rows())
            .map(|i| logits.row(i).to_vec())
            .collect())
    }
}

/// The logits after `prompt`, prefilled in one step.
pub fn prefill_logits(runner: &mut dyn ModelRunner, prompt: &[TokenId]) -> Result<Vec<f32>, Error> {
    let mut seqs = Sequences::new(runner, 1)?;
    Ok(seqs.step(&[prompt.to_vec()])?.remove(0))
}

/// `steps` greedy tokens after `prompt`.
pub fn greedy(
    runner: &mut dyn ModelRunner,
    prompt: &[TokenId],
    steps: usize,
) -> Result<Vec<TokenId>, Error> {
    let mut seqs = Sequences::new(runner, 1)?;
    let mut out = Vec::with_capacity(steps);
    let mut next = vec![prompt.to_vec()];
    for _ in 0..steps {
        let token = argmax(&seqs.step(&next)?[0]);
        out.push(token);
        next = vec![vec![token]];
    }
    Ok(out)
}

/// How many tokens `a` and `b` share before they first differ.
pub fn common_prefix(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `ln p(target)` under the softmax of `row`.
pub fn log_prob(row: &[f32], target: TokenId) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    f64::from(row[target as usize] - max) - sum.ln()
}

/// The perplexity of the windows, each read token by token from its start (every token is
/// predicted from the K/V of the ones before it in its window): `exp` of the mean negative
/// log-likelihood of all tokens but each window's first. The windows run side by side, one
/// decode step for all of them at a time; they must have the same length.
pub fn perplexity(runner: &mut dyn ModelRunner, windows: &[&[TokenId]]) -> Result<f64, Error> {
    let len = windows.first().map_or(0, |w| w.len());
    let mut seqs = Sequences::new(runner, windows.len())?;
    let (mut nll, mut count) = (0.0f64, 0usize);
    for t in 0..len.saturating_sub(1) {
        let tokens: Vec<Vec<TokenId>> = windows.iter().map(|w| vec![w[t]]).collect();
        for (row, w) in seqs.step(&tokens)?.iter().zip(windows) {
            nll -= log_prob(row, w[t + 1]);
            count += 1;
        }
    }
    Ok((nll / count.max(1) as f64).exp())
}
