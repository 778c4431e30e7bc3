//! The continuous-batching scheduler: every step, decide the batch again.
//!
//! It is chapter 3's mixed step (decodes first, then prompt chunks) over chapter 4's radix
//! cache, plus the one thing that makes a server survive load: when a decode cannot get a
//! page even after the cache gave back what it could, the newest running sequence is
//! preempted. Its computed prefix goes to the radix cache and its pages are released; it
//! waits at the front of the queue and is recomputed later, mostly from the cache. Newest
//! first, because the oldest requests have waited longest and hold the most finished work.

use phase0::{FinishReason, SeqId, TokenId};
use phase1::{BlockTable, KvPool, PageId};
use phase2::{Error, ModelRunner, SeqState};
use phase3::{
    ChunkedPrefillConfig, ChunkedScheduler, NoPrefixCache, PrefixCache, Scheduled, StepOutcome,
};
use phase4::{CacheStats, RadixCache};

use crate::config::{Batching, SchedulerConfig};

/// The radix cache when enabled, nothing otherwise.
#[derive(Debug)]
pub struct OptionalCache(pub Option<RadixCache>);

impl PrefixCache for OptionalCache {
    fn acquire(
        &mut self,
        pool: &mut KvPool,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> (Vec<PageId>, usize) {
        match &mut self.0 {
            Some(c) => c.acquire(pool, seq, tokens),
            None => NoPrefixCache.acquire(pool, seq, tokens),
        }
    }

    fn release(&mut self, pool: &mut KvPool, seq: SeqId, tokens: &[TokenId], pages: &[PageId]) {
        if let Some(c) = &mut self.0 {
            c.release(pool, seq, tokens, pages);
        }
    }

    fn evict(&mut self, pool: &mut KvPool, num_pages: usize) -> usize {
        self.0.as_mut().map_or(0, |c| c.evict(pool, num_pages))
    }
}

pub struct Scheduler {
    inner: ChunkedScheduler<OptionalCache>,
    config: SchedulerConfig,
    num_preemptions: u64,
}

impl Scheduler {
    pub fn new(pool: KvPool, config: SchedulerConfig, eos: Vec<TokenId>) -> Self {
        let page_size = pool.page_size();
        let chunked = ChunkedPrefillConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_num_seqs: config.max_num_seqs,
            chunk_size: config.chunk_size.unwrap_or(usize::MAX),
        };
        let cache = OptionalCache(
            config
                .enable_prefix_caching
                .then(|| RadixCache::new(page_size)),
        );
        let mut inner = ChunkedScheduler::with_cache(pool, chunked, eos, cache);
        inner.set_max_model_len(config.max_model_len);
        Self {
            inner,
            config,
            num_preemptions: 0,
        }
    }

    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    /// The chapter 3 scheduler underneath (its managers, pool and cache).
    pub fn chunked(&self) -> &ChunkedScheduler<OptionalCache> {
        &self.inner
    }

    pub fn chunked_mut(&mut self) -> &mut ChunkedScheduler<OptionalCache> {
        &mut self.inner
    }

    pub fn pool(&self) -> &KvPool {
        &self.inner.pool
    }

    pub fn pool_mut(&mut self) -> &mut KvPool {
        &mut self.inner.pool
    }

    pub fn cache(&self) -> Option<&RadixCache> {
        self.inner.cache.0.as_ref()
    }

    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.cache().map(RadixCache::stats)
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn num_waiting(&self) -> usize {
        self.inner.prefill.num_waiting()
    }

    /// Sequences holding a seat: decoding or in the middle of their prompt.
    pub fn num_running(&self) -> usize {
        self.inner.decode.num_running() + self.inner.prefill.num_prefilling()
    }

    pub fn has_work(&self) -> bool {
        self.inner.has_work()
    }

    pub fn add(&mut self, state: SeqState) {
        self.inner.add(state);
    }

    /// The waiting queue, in admission order (preempted sequences at the front).
    pub fn waiting(&self) -> impl Iterator<Item = &SeqState> {
        self.inner.prefill.waiting()
    }

    /// Reorders the waiting queue by `key`, smallest first, equal keys as they were: the
    /// hook for admission policies (shortest job first, priorities, ...).
    pub fn sort_waiting_by_key<K: Ord>(&mut self, key: impl FnMut(&SeqState) -> K) {
        self.inner.prefill.sort_waiting_by_key(key);
    }

    /// Pages held only by the prefix cache, given back to the pool (e.g. when the engine is
    /// idle and a test wants to see every page free).
    pub fn clear_cache(&mut self) {
        if let Some(c) = &mut self.inner.cache.0 {
            c.clear(&mut self.inner.pool);
        }
    }

    /// The running sequence admitted last (the highest id: ids grow with arrival).
    fn newest_running(&self) -> Option<SeqId> {
        let decoding = self.inner.decode.running().iter().map(SeqState::id);
        let prefilling = self.inner.prefill.prefilling().map(|r| r.state.id());
        decoding.chain(prefilling).max()
    }

    /// Sends a running sequence back to waiting: its computed prefix to the cache, its pages
    /// to the pool, its tokens kept for recomputation.
    pub fn preempt(&mut self, id: SeqId) -> bool {
        // BEGIN SOLUTION
        let Some(mut state) = self
            .inner
            .decode
            .remove(id)
            .or_else(|| self.inner.prefill.remove(id))
        else {
            return false;
        };
        self.inner.retire(&mut state);
        state.own_kv = BlockTable::new();
        state.num_computed = state.num_shared_tokens();
        state
            .seq
            .preempt()
            .expect("only running sequences are preempted");
        self.num_preemptions += 1;
        self.inner.prefill.push_front(state);
        true
        // END SOLUTION
    }

    /// Cancels a request wherever it is; its pages come back. Returns it, finished as
    /// `Aborted`, or `None` if the id is unknown (or already finished).
    pub fn abort(&mut self, id: SeqId) -> Option<SeqState> {
        let mut state = self
            .inner
            .decode
            .remove(id)
            .or_else(|| self.inner.prefill.remove(id))?;
        self.inner.retire(&mut state);
        self.inner.release_shared(&state);
        state
            .seq
            .finish(FinishReason::Aborted)
            .expect("an unfinished sequence can be aborted");
        Some(state)
    }

    /// Decides the next step: reserves every decode's slot, preempting the newest running
    /// sequences while some decode cannot grow, then fills the budget with prompt chunks. If
    /// nothing at all can run (prompts half-prefilled hold every page), the newest running
    /// sequence is preempted too, so the others can finish.
    pub fn schedule(&mut self) -> Result<Scheduled, Error> {
        // BEGIN SOLUTION
        loop {
            loop {
                let blocked = self.inner.reserve_decodes();
                if blocked.is_empty() {
                    break;
                }
                let victim = self.newest_running().expect("a blocked decode is running");
                self.preempt(victim);
            }
            let admit = match self.config.batching {
                Batching::Continuous => true,
                Batching::Static => self.num_running() == 0,
            };
            let step = self.inner.build_step(admit);
            if !step.forward.seqs.is_empty() || !self.has_work() {
                return Ok(step);
            }
            match self.newest_running() {
                Some(victim) => {
                    self.preempt(victim);
                }
                None => {
                    return Err(Error::OutOfMemory(format!(
                        "no waiting prompt fits in the {} free of {} pages",
                        self.inner.pool.num_free(),
                        self.inner.pool.num_pages()
                    )));
                }
            }
        }
        // END SOLUTION
    }

    /// Applies the sampled tokens of a step (see [`ChunkedScheduler::complete`]).
    pub fn complete(&mut self, scheduled: Scheduled, sampled: &[TokenId]) -> StepOutcome {
        self.inner.complete(scheduled, sampled)
    }

    pub fn step(&mut self, runner: &mut dyn ModelRunner) -> Result<StepOutcome, Error> {
        let scheduled = self.schedule()?;
        let sampled = runner.forward_sample(&scheduled.forward)?;
        Ok(self.complete(scheduled, &sampled))
    }
}
