//! The engine loop: requests in at any time, one scheduled step at a time, tokens out.
//!
//! `Engine` owns a [`ModelRunner`] and a [`Scheduler`] sized to the runner's KV storage.
//! `add_request` may be called between any two steps, `step` runs one iteration and reports
//! every token it produced (so callers can stream), `abort` cancels a request and returns its
//! pages. The public API of chapter 6 is a thin layer of text on top of this loop.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Instant;

use phase0::{
    Batch, FinishReason, Request, SamplingParams, SeqId, Sequence, SequenceStatus, TokenId,
};
use phase1::{BlockTable, KvPool};
use phase2::{Error, ModelRunner, SeqState};

use crate::config::SchedulerConfig;
use crate::request_pool::{RequestPool, RequestTiming};
use crate::scheduler::Scheduler;
use phase3::StepOutcome;

/// What a streaming caller receives for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEvent {
    Token(TokenId),
    Finished(FinishReason),
}

/// A request that is done, with everything a caller may want to report.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequest {
    pub id: SeqId,
    pub prompt_len: usize,
    pub output: Vec<TokenId>,
    pub reason: FinishReason,
    pub num_preemptions: u32,
    pub timing: RequestTiming,
    /// The request's own KV pages and their token count, when it asked to keep them
    /// (`keep_kv`); the caller now holds those pages and must free them.
    pub kv: Option<BlockTable>,
}

/// What one step did.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    /// Tokens produced this step, by request, in batch order.
    pub tokens: Vec<(SeqId, TokenId)>,
    pub finished: Vec<FinishedRequest>,
    pub num_prefill_tokens: usize,
    pub num_decode_tokens: usize,
    /// The step's batch; it prints as one line (`prefill #1[0..12] | decode #2 #3`) for traces,
    /// formatted only when someone prints it (a few microseconds a step at 256 sequences).
    pub plan: Batch,
}

pub struct Engine<R: ModelRunner> {
    runner: R,
    scheduler: Scheduler,
    requests: RequestPool,
    streams: HashMap<SeqId, mpsc::Sender<StreamEvent>>,
    eos: Vec<TokenId>,
    next_id: SeqId,
    base_seed: u64,
}

impl<R: ModelRunner> Engine<R> {
    /// An engine over `runner`'s KV storage. `base_seed` makes requests without a seed of
    /// their own reproducible across runs (each gets a seed derived from it and its id).
    pub fn new(
        runner: R,
        config: SchedulerConfig,
        eos: Vec<TokenId>,
        base_seed: u64,
    ) -> Result<Self, Error> {
        let pool = KvPool::new(runner.num_pages(), runner.page_size())?;
        Ok(Self {
            scheduler: Scheduler::new(pool, config, eos.clone()),
            runner,
            requests: RequestPool::new(),
            streams: HashMap::new(),
            eos,
            next_id: 0,
            base_seed,
        })
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }

    /// Ends the engine and hands its runner back (requests still queued are dropped).
    pub fn into_runner(self) -> R {
        self.runner
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    pub fn requests(&self) -> &RequestPool {
        &self.requests
    }

    pub fn eos(&self) -> &[TokenId] {
        &self.eos
    }

    /// Checks a request against the engine's limits before it is queued.
    fn admit(
        &mut self,
        prompt: Vec<TokenId>,
        params: SamplingParams,
        shared: Vec<BlockTable>,
    ) -> Result<SeqState, Error> {
        let id = self.next_id;
        let seq = Sequence::new(Request::new(id, prompt, params))?;
        let max_len = self.scheduler.config().max_model_len;
        if seq.len() >= max_len {
            return Err(Error::PromptTooLong {
                len: seq.len(),
                max: max_len - 1,
            });
        }
        let pool = self.scheduler.pool();
        let capacity = pool.num_pages() * pool.page_size();
        if seq.len() + 1 > capacity {
            return Err(Error::OutOfMemory(format!(
                "a prompt of {} tokens can never fit in {} KV slots",
                seq.len(),
                capacity
            )));
        }
        let shared_len: usize = shared.iter().map(BlockTable::num_tokens).sum();
        if shared_len >= seq.len() {
            return Err(Error::InvalidBatch(format!(
                "{shared_len} tokens of existing KV leave nothing of a {}-token prompt to compute",
                seq.len()
            )));
        }
        let page_size = self.scheduler.pool().page_size();
        for seg in &shared {
            if seg.pages().len() * page_size < seg.num_tokens() {
                return Err(Error::InvalidBatch(format!(
                    "a KV segment of {} tokens has only {} pages",
                    seg.num_tokens(),
                    seg.pages().len()
                )));
            }
            for &p in seg.pages() {
                if self.scheduler.pool().ref_count(p).map_or(true, |n| n == 0) {
                    return Err(Error::InvalidBatch(format!("KV page {p} is not allocated")));
                }
            }
        }
        self.next_id += 1;
        let seed = seq
            .params()
            .seed
            .unwrap_or_else(|| self.base_seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        Ok(SeqState::with_shared_kv(seq, seed, shared))
    }

    /// Queues a request; it joins the batch at the next step that has room.
    pub fn add_request(
        &mut self,
        prompt: Vec<TokenId>,
        params: SamplingParams,
    ) -> Result<SeqId, Error> {
        self.add_request_with_kv(prompt, params, Vec::new(), false)
    }

    /// Queues a request whose first tokens already have K/V in `shared` segments (held by their
    /// owner; the request holds them too while it runs), so only the rest is computed. With
    /// `keep_kv` its own pages are handed over in [`FinishedRequest::kv`] instead of freed.
    pub fn add_request_with_kv(
        &mut self,
        prompt: Vec<TokenId>,
        params: SamplingParams,
        shared: Vec<BlockTable>,
        keep_kv: bool,
    ) -> Result<SeqId, Error> {
        let mut state = self.admit(prompt, params, shared)?;
        state.keep_kv = keep_kv;
        let id = state.id();
        self.requests.arrive(id, Instant::now());
        self.scheduler.add(state);
        Ok(id)
    }

    /// A channel that receives each token of a queued request as it is produced and then its
    /// finish reason (`None` if the request is unknown or already finished).
    pub fn subscribe(&mut self, id: SeqId) -> Option<mpsc::Receiver<StreamEvent>> {
        self.requests.status(id)?;
        let (tx, rx) = mpsc::channel();
        self.streams.insert(id, tx);
        Some(rx)
    }

    /// Like [`Engine::add_request`], with a channel of its tokens (see [`Engine::subscribe`]).
    pub fn add_request_streaming(
        &mut self,
        prompt: Vec<TokenId>,
        params: SamplingParams,
    ) -> Result<(SeqId, mpsc::Receiver<StreamEvent>), Error> {
        let id = self.add_request(prompt, params)?;
        let rx = self.subscribe(id).expect("just queued");
        Ok((id, rx))
    }

    /// True when no request is waiting or running.
    pub fn is_finished(&self) -> bool {
        !self.scheduler.has_work()
    }

    fn finish(&mut self, state: SeqState, now: Instant) -> FinishedRequest {
        let id = state.id();
        let reason = state
            .seq
            .finish_reason()
            .expect("a finished sequence has a reason");
        self.requests
            .set_status(id, SequenceStatus::Finished(reason), now);
        if let Some(tx) = self.streams.remove(&id) {
            let _ = tx.send(StreamEvent::Finished(reason));
        }
        FinishedRequest {
            id,
            prompt_len: state.seq.prompt().len(),
            output: state.seq.output().to_vec(),
            reason,
            num_preemptions: state.seq.num_preemptions(),
            timing: self.requests.remove(id).expect("known request"),
            kv: (state.keep_kv && !state.own_kv.is_empty()).then(|| {
                let shared: usize = state.num_shared_tokens();
                BlockTable::from_pages(state.own_kv.pages().to_vec(), state.num_computed - shared)
            }),
        }
    }

    /// Cancels a request; its pages come back at once. Returns it, or `None` if unknown or
    /// already finished.
    pub fn abort(&mut self, id: SeqId) -> Option<FinishedRequest> {
        let state = self.scheduler.abort(id)?;
        Some(self.finish(state, Instant::now()))
    }

    /// Runs one scheduling step on the model.
    pub fn step(&mut self) -> Result<StepOutput, Error> {
        // BEGIN SOLUTION
        let scheduled = self.scheduler.schedule()?;
        let sampled = self.runner.forward_sample(&scheduled.forward)?;
        let outcome = self.scheduler.complete(scheduled, &sampled);
        Ok(self.publish(outcome))
        // END SOLUTION
    }

    /// Hands a step's tokens to the request records and streams, and its finished requests to
    /// the caller: the end of every step, however it was computed.
    pub fn publish(&mut self, outcome: StepOutcome) -> StepOutput {
        // BEGIN SOLUTION
        let now = Instant::now();
        let mut gone = Vec::new();
        for &(id, token) in &outcome.tokens {
            self.requests.token(id, now);
            if let Some(tx) = self.streams.get(&id)
                && tx.send(StreamEvent::Token(token)).is_err()
            {
                gone.push(id);
            }
        }
        let mut output = StepOutput {
            num_prefill_tokens: outcome.plan.num_prefill_tokens(),
            num_decode_tokens: outcome.plan.num_decode_tokens(),
            plan: outcome.plan,
            tokens: outcome.tokens,
            finished: Vec::new(),
        };
        for state in outcome.finished {
            output.finished.push(self.finish(state, now));
        }
        // A dropped receiver means nobody wants the rest: stop computing it.
        for id in gone {
            self.streams.remove(&id);
            output.finished.extend(self.abort(id));
        }
        output
        // END SOLUTION
    }

    /// Steps until every request finished; returns them in the order they finished.
    pub fn run_to_completion(&mut self) -> Result<Vec<FinishedRequest>, Error> {
        let mut done = Vec::new();
        while !self.is_finished() {
            done.extend(self.step()?.finished);
        }
        Ok(done)
    }
}
