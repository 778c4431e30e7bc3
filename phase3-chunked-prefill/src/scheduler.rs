//! One mixed step: every running decode plus as many prompt chunks as the budget allows.
//!
//! This is the whole serving loop of chapter 3: `schedule` decides a step and reserves its
//! pages, the runner computes it, `complete` applies the sampled tokens. Decodes are
//! scheduled first, so a long prompt can delay them by at most one chunk's worth of compute.

use phase0::{Batch, FinishReason, SeqId, TokenId};
use phase1::KvPool;
use phase2::{DecodeManager, Error, ForwardBatch, ModelRunner, SeqState};

use crate::chunked_prefill::{ChunkedPrefillConfig, ChunkedPrefillManager, PrefillChunk};
use crate::prefix_cache::{NoPrefixCache, PrefixCache};

/// A decided step: what the model computes, and the same step as a readable [`Batch`].
#[derive(Debug, Clone)]
pub struct Scheduled {
    pub forward: ForwardBatch,
    pub plan: Batch,
    /// The running sequences the step decodes, in the decode manager's order.
    pub decodes: Vec<SeqId>,
    pub chunks: Vec<PrefillChunk>,
}

/// What a step produced.
#[derive(Debug, Default)]
pub struct StepOutcome {
    pub plan: Batch,
    /// Every token sampled in this step, by sequence.
    pub tokens: Vec<(SeqId, TokenId)>,
    /// Sequences that finished in this step; their pages are already released.
    pub finished: Vec<SeqState>,
}

/// The chapter 3 scheduler: decode first, then chunked prefill, over one page pool.
pub struct ChunkedScheduler<C: PrefixCache = NoPrefixCache> {
    pub pool: KvPool,
    pub prefill: ChunkedPrefillManager,
    pub decode: DecodeManager,
    pub cache: C,
    eos: Vec<TokenId>,
    max_model_len: usize,
}

impl ChunkedScheduler<NoPrefixCache> {
    pub fn new(pool: KvPool, config: ChunkedPrefillConfig, eos: Vec<TokenId>) -> Self {
        Self::with_cache(pool, config, eos, NoPrefixCache)
    }
}

impl<C: PrefixCache> ChunkedScheduler<C> {
    pub fn with_cache(
        pool: KvPool,
        config: ChunkedPrefillConfig,
        eos: Vec<TokenId>,
        cache: C,
    ) -> Self {
        Self {
            pool,
            prefill: ChunkedPrefillManager::new(config),
            decode: DecodeManager::new(),
            cache,
            eos,
            max_model_len: usize::MAX,
        }
    }

    /// Sequences stop with `Length` when they reach this many tokens.
    pub fn set_max_model_len(&mut self, max_model_len: usize) {
        self.max_model_len = max_model_len;
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Queues a sequence. It holds each page of its shared segments while it lives, so their
    /// owner may let go of them at any time without pulling pages from under it.
    pub fn add(&mut self, state: SeqState) {
        for seg in &state.shared_kv {
            for &page in seg.pages() {
                self.pool
                    .share(page)
                    .expect("shared segments are allocated by their owner");
            }
        }
        self.prefill.add(state);
    }

    /// Drops the holders a leaving sequence took on its shared segments.
    pub fn release_shared(&mut self, state: &SeqState) {
        for seg in &state.shared_kv {
            self.pool
                .free_all(seg.pages())
                .expect("a sequence holds its shared pages once");
        }
    }

    pub fn has_work(&self) -> bool {
        self.decode.num_running() + self.prefill.num_prefilling() + self.prefill.num_waiting() > 0
    }

    /// Reserves every decode's slot; when the pool is short the cache gives pages back first.
    /// Returns the ids of decodes that still have no slot.
    pub fn reserve_decodes(&mut self) -> Vec<SeqId> {
        let plan = self.decode.schedule(&mut self.pool);
        if plan.blocked.is_empty() {
            return plan.blocked;
        }
        self.cache.evict(&mut self.pool, plan.blocked.len());
        let mut still_blocked = Vec::new();
        for id in plan.blocked {
            let state = self
                .decode
                .running_mut()
                .iter_mut()
                .find(|s| s.id() == id)
                .expect("blocked sequences are running");
            if state.reserve(&mut self.pool, 1).is_err() {
                still_blocked.push(id);
            }
        }
        still_blocked
    }

    /// Builds the step once every decode has its slot: decodes, then prompt chunks (and new
    /// prompts only when `admit` is true).
    pub fn build_step(&mut self, admit: bool) -> Scheduled {
        let decodes: Vec<SeqId> = self.decode.running().iter().map(SeqState::id).collect();
        let chunks = self
            .prefill
            .schedule(&mut self.pool, &mut self.cache, decodes.len(), admit);
        let mut forward = ForwardBatch::default();
        let mut plan = Batch::new();
        for s in self.decode.running() {
            forward.seqs.push(s.forward_seq(1));
            plan.push_decode(s.id());
        }
        for c in &chunks {
            let s = self
                .prefill
                .get(c.seq_id)
                .expect("a chunk's sequence is prefilling");
            forward.seqs.push(s.forward_seq(c.num_tokens));
            plan.push_prefill(c.seq_id, s.num_computed, c.num_tokens);
        }
        Scheduled {
            forward,
            plan,
            decodes,
            chunks,
        }
    }

    /// Decides the next step. Without preemption (chapter 5) a decode that cannot get a page
    /// is an out-of-memory error.
    pub fn schedule(&mut self) -> Result<Scheduled, Error> {
        if let Some(&id) = self.reserve_decodes().first() {
            return Err(Error::OutOfMemory(format!(
                "sequence {id} cannot grow ({} of {} pages free)",
                self.pool.num_free(),
                self.pool.num_pages()
            )));
        }
        let step = self.build_step(true);
        if step.forward.seqs.is_empty() && self.has_work() {
            return Err(Error::OutOfMemory(format!(
                "no waiting prompt fits in the {} free of {} pages",
                self.pool.num_free(),
                self.pool.num_pages()
            )));
        }
        Ok(step)
    }

    /// Applies a step's sampled tokens (in the order of the sampling sequences of
    /// `scheduled.forward`): decodes advance, finished prompts start decoding, finished
    /// sequences leave and give their pages back.
    pub fn complete(&mut self, scheduled: Scheduled, sampled: &[TokenId]) -> StepOutcome {
        // BEGIN SOLUTION
        let mut outcome = StepOutcome {
            plan: scheduled.plan,
            ..Default::default()
        };
        let mut sampled_by_seq = scheduled
            .forward
            .seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .map(|s| s.seq_id)
            .zip(sampled.iter().copied());
        let mut next_token = |id: SeqId| {
            let (sid, token) = sampled_by_seq
                .next()
                .expect("one token per sampling sequence");
            debug_assert_eq!(sid, id);
            token
        };

        // Decodes come first in the batch, then chunks: take tokens in that order. The
        // running list is the one the step was built from, in the same order.
        let running = self.decode.running_mut();
        assert_eq!(
            running.len(),
            scheduled.decodes.len(),
            "running set changed mid-step"
        );
        for (state, id) in running.iter_mut().zip(&scheduled.decodes) {
            let token = next_token(*id);
            state.num_computed += 1;
            append(
                state,
                token,
                &self.eos,
                self.max_model_len,
                &mut outcome.tokens,
            );
        }
        for mut state in self.prefill.complete(&scheduled.chunks) {
            let token = next_token(state.id());
            append(
                &mut state,
                token,
                &self.eos,
                self.max_model_len,
                &mut outcome.tokens,
            );
            self.decode.add(state);
        }
        for mut state in self.decode.take_finished() {
            if state.keep_kv {
                // Its pages go to the caller: only the cache lock is dropped.
                self.cache.release(&mut self.pool, state.id(), &[], &[]);
            } else {
                self.retire(&mut state);
            }
            self.release_shared(&state);
            outcome.finished.push(state);
        }
        outcome
        // END SOLUTION
    }

    /// Offers a leaving sequence's computed pages to the cache, then frees its own holders.
    /// A sequence that reads shared segments (registered chunks) offers nothing: its own pages
    /// do not start at token 0, so they cannot be a prefix.
    pub fn retire(&mut self, state: &mut SeqState) {
        let tokens = state.seq.all_tokens();
        let (computed, pages) = if state.shared_kv.is_empty() {
            (&tokens[..state.num_computed], state.own_kv.pages())
        } else {
            (&[][..], &[][..])
        };
        self.cache
            .release(&mut self.pool, state.id(), computed, pages);
        state
            .release(&mut self.pool)
            .expect("a sequence holds each of its pages once");
    }

    /// One whole step on a runner.
    pub fn step(&mut self, runner: &mut dyn ModelRunner) -> Result<StepOutcome, Error> {
        let scheduled = self.schedule()?;
        let sampled = runner.forward_sample(&scheduled.forward)?;
        Ok(self.complete(scheduled, &sampled))
    }
}

/// Appends a sampled token and applies the stop rules, the model's length limit included.
fn append(
    state: &mut SeqState,
    token: TokenId,
    eos: &[TokenId],
    max_model_len: usize,
    out: &mut Vec<(SeqId, TokenId)>,
) {
    out.push((state.id(), token));
    let finished = state
        .seq
        .append_token(token, eos)
        .expect("a scheduled sequence is running");
    if finished.is_none() && state.seq.len() >= max_model_len {
        state
            .seq
            .finish(FinishReason::Length)
            .expect("a running sequence can finish");
    }
}
