//! Overlap scheduling: deciding step n+1 before step n's tokens are back changes no token and
//! loses no page, also when sequences stop on EOS (and so run one step too many) or are
//! aborted while a step is queued for them. Host-only: a runner that queues steps like a device.

use std::collections::{BTreeMap, HashMap, VecDeque};

use phase0::{SamplingParams, SeqId, TokenId};
use phase1::KvLayout;
use phase2::{Error, ForwardBatch, HashRunner, Logits, ModelRunner};
use phase5::{Batching, Engine, SchedulerConfig, StepOutput};
use phase6_cuda::{Overlap, PENDING_TOKEN, QueuedRunner};
use proptest::prelude::*;

const VOCAB: usize = 300;

/// A runner that queues steps like a device would: `launch` computes the step at once (so the
/// queue holds results), with each `PENDING_TOKEN` replaced by the token the same sequence
/// sampled in the step launched just before.
struct Queued {
    inner: HashRunner,
    done: VecDeque<Vec<TokenId>>,
    last: HashMap<SeqId, TokenId>,
    launches: usize,
    pending_inputs: usize,
}

impl Queued {
    fn new(pages: usize, page_size: usize) -> Self {
        Self {
            inner: HashRunner::new(pages, page_size, VOCAB),
            done: VecDeque::new(),
            last: HashMap::new(),
            launches: 0,
            pending_inputs: 0,
        }
    }
}

impl ModelRunner for Queued {
    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }
    fn num_pages(&self) -> usize {
        self.inner.num_pages()
    }
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        self.inner.forward(batch)
    }
}

impl QueuedRunner for Queued {
    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        let mut batch = batch.clone();
        for s in &mut batch.seqs {
            for t in &mut s.tokens {
                if *t == PENDING_TOKEN {
                    *t = *self
                        .last
                        .get(&s.seq_id)
                        .expect("sampled in the step before");
                    self.pending_inputs += 1;
                }
            }
        }
        let tokens = self.inner.forward_sample(&batch)?;
        let sampling = batch.seqs.iter().filter(|s| s.sample.is_some());
        self.last = sampling
            .map(|s| s.seq_id)
            .zip(tokens.iter().copied())
            .collect();
        self.done.push_back(tokens);
        self.launches += 1;
        Ok(())
    }
    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        Ok(self.done.pop_front().expect("a step was launched"))
    }
}

fn config(max_num_seqs: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: 48,
        max_num_seqs,
        chunk_size: Some(8),
        enable_prefix_caching: true,
        batching: Batching::Continuous,
        max_model_len: 4096,
    }
}

/// Every tenth token id ends a sequence, so that many stop on EOS.
fn eos() -> Vec<TokenId> {
    (0..VOCAB as TokenId).step_by(10).collect()
}

/// How a test steps its engine: one step at a time, or with overlap.
trait Stepper<R: ModelRunner> {
    fn step(&mut self, engine: &mut Engine<R>) -> StepOutput;
    fn done(&self, engine: &Engine<R>) -> bool;
}

struct OneAtATime;

impl Stepper<HashRunner> for OneAtATime {
    fn step(&mut self, engine: &mut Engine<HashRunner>) -> StepOutput {
        engine.step().unwrap()
    }
    fn done(&self, engine: &Engine<HashRunner>) -> bool {
        engine.is_finished()
    }
}

impl Stepper<Queued> for Overlap {
    fn step(&mut self, engine: &mut Engine<Queued>) -> StepOutput {
        Overlap::step(self, engine, |r| r).unwrap()
    }
    fn done(&self, engine: &Engine<Queued>) -> bool {
        engine.is_finished() && !self.in_flight()
    }
}

/// Runs `prompts` (all queued at once, `abort_at`: (step, index) pairs) to the end; outputs of
/// the requests that were not aborted, by index.
fn run<R: ModelRunner>(
    engine: &mut Engine<R>,
    stepper: &mut impl Stepper<R>,
    prompts: &[(Vec<TokenId>, usize)],
    abort_at: &[(usize, usize)],
) -> BTreeMap<usize, Vec<TokenId>> {
    let ids: Vec<SeqId> = prompts
        .iter()
        .map(|(p, max_tokens)| {
            let params = SamplingParams::greedy().with_max_tokens(*max_tokens);
            engine.add_request(p.clone(), params).unwrap()
        })
        .collect();
    let mut out = BTreeMap::new();
    let mut step = 0;
    while !stepper.done(engine) {
        for &(_, i) in abort_at.iter().filter(|(s, _)| *s == step) {
            engine.abort(ids[i]);
        }
        for f in stepper.step(engine).finished {
            if f.reason != phase0::FinishReason::Aborted {
                out.insert(ids.iter().position(|&id| id == f.id).unwrap(), f.output);
            }
        }
        step += 1;
        assert!(step < 10_000, "no progress");
    }
    out
}

fn prompts() -> impl Strategy<Value = Vec<(Vec<TokenId>, usize)>> {
    prop::collection::vec((1usize..20, 1usize..24, 0u32..1000), 1..8).prop_map(|v| {
        v.into_iter()
            .map(|(len, max_tokens, salt)| {
                let prompt = (0..len as u32).map(|j| 1 + (j * 7 + salt) % 299).collect();
                (prompt, max_tokens)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn overlap_gives_the_tokens_of_the_synchronous_engine(
        prompts in prompts(),
        max_num_seqs in 1usize..6,
        page_size in 1usize..5,
        tight in any::<bool>(),
        aborts in prop::collection::vec((0usize..30, 0usize..8), 0..3),
    ) {
        let longest = prompts.iter().map(|(p, m)| p.len() + m).max().unwrap();
        let pages = if tight { longest.div_ceil(page_size) + 2 } else { 256 };
        let aborts: Vec<(usize, usize)> =
            aborts.into_iter().filter(|&(_, i)| i < prompts.len()).collect();
        // Aborts land on the same step numbers in both runs only without them, so the
        // synchronous reference runs the aborted requests to the end and their outputs are
        // left out of the comparison.
        let mut sync = Engine::new(HashRunner::new(pages, page_size, VOCAB), config(max_num_seqs), eos(), 7).unwrap();
        let mut expected = run(&mut sync, &mut OneAtATime, &prompts, &[]);
        for (_, i) in &aborts {
            expected.remove(i);
        }

        let mut e = Engine::new(Queued::new(pages, page_size), config(max_num_seqs), eos(), 7).unwrap();
        let mut got = run(&mut e, &mut Overlap::new(true), &prompts, &aborts);
        for (_, i) in &aborts {
            got.remove(i);
        }
        prop_assert_eq!(&got, &expected);
        e.scheduler_mut().clear_cache();
        prop_assert_eq!(e.scheduler().pool().num_free(), pages, "every page back");
    }
}

#[test]
fn decode_stretches_are_launched_ahead() {
    let prompts: Vec<(Vec<TokenId>, usize)> = (0..4)
        .map(|i| ((1..=10).map(|j| j * 3 + i).collect(), 20 + i as usize))
        .collect();
    let mut sync = Engine::new(HashRunner::new(64, 4, VOCAB), config(4), vec![], 7).unwrap();
    let expected = run(&mut sync, &mut OneAtATime, &prompts, &[]);
    let mut e = Engine::new(Queued::new(64, 4), config(4), vec![], 7).unwrap();
    let got = run(&mut e, &mut Overlap::new(true), &prompts, &[]);
    assert_eq!(got, expected);
    let runner = e.runner();
    // 4 x 10 prompt tokens fit one step; then every decode step but the first is decided
    // while the one before it runs, and feeds on its tokens from the device.
    assert!(
        runner.pending_inputs >= 4 * 15,
        "only {} decode inputs came from a step in flight",
        runner.pending_inputs
    );
    assert_eq!(
        e.scheduler().pool().num_free() + e.scheduler().pool().num_used(),
        64
    );
}
