//! Helpers shared by the chapter 3 tests: requests and a run-to-completion loop.

use std::collections::BTreeMap;

use phase0::{Request, SamplingParams, SeqId, Sequence, TokenId};
use phase2::{HashRunner, SeqState};
use phase3::{ChunkedScheduler, PrefixCache};

pub const VOCAB: usize = 1000;

/// A greedy request with a prompt of `len` distinct-ish tokens.
pub fn request(id: SeqId, len: usize, max_tokens: usize) -> SeqState {
    let prompt: Vec<TokenId> = (0..len as u32).map(|i| (i * 7 + id as u32) % 997).collect();
    let params = SamplingParams::greedy().with_max_tokens(max_tokens);
    SeqState::new(Sequence::new(Request::new(id, prompt, params)).unwrap(), id)
}

/// Runs until every sequence finished; returns outputs by id and the step traces.
pub fn run_all<C: PrefixCache>(
    scheduler: &mut ChunkedScheduler<C>,
    runner: &mut HashRunner,
) -> (BTreeMap<SeqId, Vec<TokenId>>, Vec<String>) {
    let mut outputs = BTreeMap::new();
    let mut trace = Vec::new();
    let mut steps = 0;
    while scheduler.has_work() {
        let outcome = scheduler.step(runner).expect("step succeeds");
        trace.push(outcome.plan.to_string());
        for s in outcome.finished {
            outputs.insert(s.id(), s.seq.output().to_vec());
        }
        steps += 1;
        assert!(steps < 100_000, "no progress");
    }
    (outputs, trace)
}
