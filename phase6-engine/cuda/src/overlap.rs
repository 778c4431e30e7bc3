//! Overlap scheduling: deciding step n+1 while the device computes step n (SGLang's overlap
//! scheduler).
//!
//! Between two steps the host applies the sampled tokens, schedules, packs the next step's
//! inputs and launches it; with a fast GPU that gap is a large share of a decode step. A
//! runner that queues work ([`QueuedRunner`]) returns from `launch` before the step ran, so the
//! engine can decide the next step meanwhile, when that step is certain to be "every decode
//! again": its inputs are then the tokens step n samples, which only the device knows yet
//! ([`PENDING_TOKEN`]), and the runner takes them there. Tokens are the same as one step at a
//! time; [`OverlapDriver`] runs an [`LLM`](phase6::LLM)'s steps this way.

use std::any::Any;

use phase0::{Batch, SeqId, TokenId};
use phase1::BlockTable;
use phase2::{Error, ForwardBatch, ForwardSeq, ModelRunner, SampleSpec, SeqState};
use phase3::{ChunkedScheduler, PrefixCache, Scheduled};
use phase5::{Engine, FinishedRequest, StepOutput};
use phase6::StepDriver;
use phase6_chunks::ChunkRunner;

pub use phase6_cuda_plan::PENDING_TOKEN;

/// A runner that queues steps on a device and returns before they have run.
pub trait QueuedRunner: ModelRunner {
    /// Queues a step like [`ModelRunner::forward_sample`]; [`QueuedRunner::collect`] returns its
    /// tokens, oldest launched step first. A decode input may be [`PENDING_TOKEN`] when the step
    /// launched just before samples that sequence.
    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error>;

    /// Waits for the oldest launched step and returns its sampled tokens, in batch order.
    fn collect(&mut self) -> Result<Vec<TokenId>, Error>;
}

/// Decides the step after `in_flight` while the device still computes it, when that next step
/// is certain to be "every decode again": `in_flight` has no prompt chunks and no prompt is
/// waiting or prefilling. Each decode's input is then [`PENDING_TOKEN`], and it gets the slot
/// after the one `in_flight` fills. A sequence that `in_flight` takes to its length limit is
/// left out; one that stops on EOS is only found out when `in_flight` completes, so the step
/// runs it once more and [`retain_decodes`] drops that token. `None`, with nothing changed but
/// maybe a slot reserved early, when the step cannot be known yet (prompts to admit, a page
/// short, sequences that hand their KV over or read shared segments).
pub fn schedule_ahead<C: PrefixCache>(
    scheduler: &mut ChunkedScheduler<C>,
    in_flight: &Scheduled,
) -> Option<Scheduled> {
    if !in_flight.chunks.is_empty()
        || scheduler.prefill.num_waiting() + scheduler.prefill.num_prefilling() > 0
    {
        return None;
    }
    let running = scheduler.decode.running();
    if running.len() != in_flight.decodes.len()
        || running
            .iter()
            .zip(&in_flight.decodes)
            .any(|(s, &id)| s.id() != id || s.keep_kv || !s.shared_kv.is_empty())
    {
        return None;
    }
    let max_model_len = scheduler.max_model_len();
    let last_token = |s: &SeqState| {
        s.seq.output().len() + 1 >= s.seq.params().max_tokens || s.seq.len() + 1 >= max_model_len
    };
    let mut forward = ForwardBatch::default();
    let mut plan = Batch::new();
    let mut decodes = Vec::new();
    let pool = &mut scheduler.pool;
    for s in scheduler.decode.running_mut() {
        if last_token(s) {
            continue;
        }
        // Slots for the token in flight (already reserved) and the one after it.
        if s.reserve(pool, 2).is_err() {
            return None;
        }
        forward.seqs.push(decode_ahead(s));
        plan.push_decode(s.id());
        decodes.push(s.id());
    }
    if decodes.is_empty() {
        return None;
    }
    Some(Scheduled {
        forward,
        plan,
        decodes,
        chunks: Vec::new(),
    })
}

/// The forward input of the decode after the one in flight: [`PENDING_TOKEN`] at position
/// `num_computed + 1` (a sequence with no shared segments, its slots reserved).
fn decode_ahead(s: &SeqState) -> ForwardSeq {
    let start = s.num_computed + 1;
    let step = s.seq.output().len() as u64 + 1;
    ForwardSeq {
        seq_id: s.id(),
        tokens: vec![PENDING_TOKEN],
        start_pos: start,
        kv: vec![BlockTable::from_pages(s.own_kv.pages().to_vec(), start + 1)],
        sample: Some(SampleSpec::new(s.seq.params(), s.seed, step)),
    }
}

/// Drops the decodes of sequences that left after the step was decided (they finished in the
/// step before, or were aborted), with their rows of `sampled`: a step decided ahead ran them
/// anyway, and their tokens are void.
pub fn retain_decodes(
    scheduled: &mut Scheduled,
    sampled: &mut Vec<TokenId>,
    keep: impl Fn(SeqId) -> bool,
) {
    if scheduled.decodes.iter().all(|&id| keep(id)) {
        return;
    }
    debug_assert!(
        scheduled.chunks.is_empty(),
        "only decode-only steps are decided ahead"
    );
    let mut tokens = sampled.iter().copied();
    let mut kept_tokens = Vec::with_capacity(sampled.len());
    let mut plan = Batch::new();
    scheduled.forward.seqs.retain(|s| {
        let token = s.sample.and_then(|_| tokens.next());
        let k = keep(s.seq_id);
        if k {
            kept_tokens.extend(token);
            plan.push_decode(s.seq_id);
        }
        k
    });
    scheduled.decodes.retain(|&id| keep(id));
    scheduled.plan = plan;
    *sampled = kept_tokens;
}

/// The engine loop with overlap: the state it keeps between steps is the step launched ahead.
#[derive(Debug, Default)]
pub struct Overlap {
    ahead: Option<Scheduled>,
    /// Off: a step already launched ahead still finishes, and no new one is launched ahead.
    pub enabled: bool,
}

impl Overlap {
    pub fn new(enabled: bool) -> Self {
        Self {
            ahead: None,
            enabled,
        }
    }

    /// Whether a step launched ahead is still to be collected.
    pub fn in_flight(&self) -> bool {
        self.ahead.is_some()
    }

    /// One step of `engine`: the step launched by the previous call (or decided and launched
    /// now), with the step after it decided and launched before this one's tokens are waited
    /// for. `queue` reaches the engine's runner as a [`QueuedRunner`].
    pub fn step<R: ModelRunner>(
        &mut self,
        engine: &mut Engine<R>,
        queue: impl Fn(&mut R) -> &mut dyn QueuedRunner,
    ) -> Result<StepOutput, Error> {
        // BEGIN SOLUTION
        let mut current = match self.ahead.take() {
            Some(s) => s,
            None => {
                let s = engine.scheduler_mut().schedule()?;
                queue(engine.runner_mut()).launch(&s.forward)?;
                s
            }
        };
        if self.enabled
            && let Some(next) = schedule_ahead(engine.scheduler_mut().chunked_mut(), &current)
        {
            queue(engine.runner_mut()).launch(&next.forward)?;
            self.ahead = Some(next);
        }
        let mut sampled = queue(engine.runner_mut()).collect()?;
        let requests = engine.requests();
        retain_decodes(&mut current, &mut sampled, |id| {
            requests.status(id).is_some()
        });
        let outcome = engine.scheduler_mut().complete(current, &sampled);
        Ok(engine.publish(outcome))
        // END SOLUTION
    }

    /// Steps `engine` until every request has finished and no step is in flight: the engine's
    /// `run_to_completion`, overlapped. The requests in the order they finished.
    pub fn run_to_completion<R: ModelRunner>(
        &mut self,
        engine: &mut Engine<R>,
        queue: impl Fn(&mut R) -> &mut dyn QueuedRunner,
    ) -> Result<Vec<FinishedRequest>, Error> {
        let mut done = Vec::new();
        while !engine.is_finished() || self.in_flight() {
            done.extend(self.step(engine, &queue)?.finished);
        }
        Ok(done)
    }
}

/// Runs an `LLM`'s steps with [`Overlap`] on a runner of type `Q` (the one the LLM was
/// started with: the driver reaches it through the engine's boxed runner).
pub struct OverlapDriver<Q> {
    overlap: Overlap,
    runner: std::marker::PhantomData<fn() -> Q>,
}

impl<Q: QueuedRunner> OverlapDriver<Q> {
    pub fn new(enabled: bool) -> Self {
        Self {
            overlap: Overlap::new(enabled),
            runner: std::marker::PhantomData,
        }
    }

    fn queue(runner: &mut dyn Any) -> &mut dyn QueuedRunner {
        runner
            .downcast_mut::<Q>()
            .expect("an OverlapDriver drives the runner type it was made for")
    }
}

impl<Q: QueuedRunner> StepDriver<dyn ModelRunner> for OverlapDriver<Q> {
    fn step(&mut self, engine: &mut Engine<Box<dyn ModelRunner>>) -> Result<StepOutput, Error> {
        self.overlap.step(engine, |r| Self::queue(&mut **r))
    }

    fn in_flight(&self) -> bool {
        self.overlap.in_flight()
    }
}

impl<Q: QueuedRunner> StepDriver<dyn ChunkRunner> for OverlapDriver<Q> {
    fn step(&mut self, engine: &mut Engine<Box<dyn ChunkRunner>>) -> Result<StepOutput, Error> {
        self.overlap.step(engine, |r| Self::queue(&mut **r))
    }

    fn in_flight(&self) -> bool {
        self.overlap.in_flight()
    }
}
