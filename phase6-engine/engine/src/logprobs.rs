//! Chapter 6.1: log-probabilities of the sampled tokens, for the requests that ask for them
//! (OpenAI's `logprobs`). A request opts in with [`Logprobs::want`]; [`LogprobDriver`] then
//! runs its steps as chapter 5's loop does (schedule, forward, sample, complete, publish) but
//! keeps, for each token sampled for such a request, the log-softmax of the logits it was
//! sampled from, and the best alternatives.
//!
//! The numbers are the model's own distribution, before temperature, top-k and top-p, as
//! vLLM returns by default: what the model thought of the token, whatever the sampler's
//! settings. A step where no request asked is the engine's plain step, so the default path
//! costs one lock and nothing else.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use phase0::{SeqId, TokenId};
use phase2::ModelRunner;
use phase5::{Engine, StepOutput};

use crate::driver::StepDriver;

/// The log-probability of one sampled token, and the `top` most likely tokens at its place
/// (most likely first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: TokenId,
    pub logprob: f32,
    pub top: Vec<(TokenId, f32)>,
}

struct Wanted {
    top: usize,
    ready: VecDeque<TokenLogprobs>,
}

/// Which requests want log-probabilities, and those computed but not yet taken. Clones share
/// one record: the driver writes it, the engine's caller reads it.
#[derive(Clone, Default)]
pub struct Logprobs(Arc<Mutex<HashMap<SeqId, Wanted>>>);

impl Logprobs {
    fn lock(&self) -> MutexGuard<'_, HashMap<SeqId, Wanted>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Request `id` wants the log-probability of each of its tokens and the `top` best
    /// alternatives; call it before the request's first step.
    pub fn want(&self, id: SeqId, top: usize) {
        let ready = VecDeque::new();
        self.lock().insert(id, Wanted { top, ready });
    }

    /// The next token's log-probabilities of request `id`, in the order its tokens came.
    pub fn take(&self, id: SeqId) -> Option<TokenLogprobs> {
        self.lock().get_mut(&id)?.ready.pop_front()
    }

    /// The request ended: nothing more is kept for it.
    pub fn forget(&self, id: SeqId) {
        self.lock().remove(&id);
    }
}

/// `token`'s log-probability under `logits` (a log-softmax), and the `top` best tokens'.
pub fn token_logprobs(logits: &[f32], token: TokenId, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // Summed in f64, as the sampler does: over a large vocabulary f32 sums drift.
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let logprob = |x: f32| (x as f64 - log_z) as f32;
    let mut best: Vec<TokenId> = (0..logits.len() as TokenId).collect();
    let top = top.min(logits.len());
    if top > 0 {
        let by_logit = |a: &TokenId, b: &TokenId| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        best.select_nth_unstable_by(top - 1, by_logit);
        best.truncate(top);
        best.sort_unstable_by(by_logit);
    } else {
        best.clear();
    }
    TokenLogprobs {
        token,
        logprob: logprob(logits[token as usize]),
        top: best
            .into_iter()
            .map(|t| (t, logprob(logits[t as usize])))
            .collect(),
    }
}

/// Steps like `OneStepAtATime`, and keeps the log-probabilities of the tokens sampled for
/// the requests in its [`Logprobs`]. Only for runners that sample on the host (the CPU):
/// it asks the runner for logits and samples them itself.
pub struct LogprobDriver {
    logprobs: Logprobs,
}

impl LogprobDriver {
    pub fn new(logprobs: Logprobs) -> Self {
        Self { logprobs }
    }
}

impl<R: ?Sized + ModelRunner> StepDriver<R> for LogprobDriver {
    fn step(&mut self, engine: &mut Engine<Box<R>>) -> Result<StepOutput, phase2::Error> {
        if self.logprobs.lock().is_empty() {
            return engine.step();
        }
        let scheduled = engine.scheduler_mut().schedule()?;
        let logits = engine.runner_mut().forward(&scheduled.forward)?;
        let mut wanted = self.logprobs.lock();
        let sampled: Vec<TokenId> = scheduled
            .forward
            .seqs
            .iter()
            .filter_map(|s| Some((s.seq_id, s.sample?)))
            .enumerate()
            .map(|(row, (id, spec))| {
                let row = logits.row(row);
                let token = phase2::sampler::sample(row, &spec);
                if let Some(w) = wanted.get_mut(&id) {
                    w.ready.push_back(token_logprobs(row, token, w.top));
                }
                token
            })
            .collect();
        drop(wanted);
        let outcome = engine.scheduler_mut().complete(scheduled, &sampled);
        Ok(engine.publish(outcome))
    }

    fn in_flight(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_best_first() {
        let lp = token_logprobs(&[1.0, 3.0, 2.0, 3.0], 2, 3);
        let z = (1f64.exp() + 2.0 * 3f64.exp() + 2f64.exp()).ln();
        assert!((lp.logprob as f64 - (2.0 - z)).abs() < 1e-6);
        let ids: Vec<TokenId> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2], "ties by id");
        let total: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|x| (x - z).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(token_logprobs(&[0.5, 0.5], 0, 0).top.is_empty());
    }
}
