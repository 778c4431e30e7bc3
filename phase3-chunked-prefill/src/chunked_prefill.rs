//! Filling each step's token budget with prompt chunks, round robin.
//!
//! Each step the scheduler first counts its decodes (one token each), then asks this manager
//! to spend the rest of `max_num_batched_tokens` on prefill. Prompts already in progress go
//! first, each taking at most `chunk_size` tokens, in round-robin order: the ones served this
//! step move to the back of the line, so a long prompt cannot starve a shorter one that
//! arrived after it. Whatever budget is left admits new prompts, first come first served.
//! Pages are reserved one chunk at a time, so a long prompt holds only what it has computed.

use std::collections::VecDeque;

use phase0::SeqId;
use phase1::KvPool;
use phase2::SeqState;

use crate::chunked_request::ChunkedRequest;
use crate::prefix_cache::PrefixCache;

/// The limits of chunked prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedPrefillConfig {
    /// Tokens computed in one step, decodes included.
    pub max_num_batched_tokens: usize,
    /// Sequences running at once, prefilling or decoding.
    pub max_num_seqs: usize,
    /// Most prompt tokens one request gets in one step (`usize::MAX`: whole prompts).
    pub chunk_size: usize,
}

impl Default for ChunkedPrefillConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
            chunk_size: 512,
        }
    }
}

/// One request's share of prefill in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    pub seq_id: SeqId,
    pub num_tokens: usize,
}

#[derive(Debug, Default)]
pub struct ChunkedPrefillManager {
    config: ChunkedPrefillConfig,
    /// Not started yet (new, or preempted), first come first served.
    waiting: VecDeque<SeqState>,
    /// Started and not done, in round-robin order.
    prefilling: VecDeque<ChunkedRequest>,
}

impl ChunkedPrefillManager {
    pub fn new(config: ChunkedPrefillConfig) -> Self {
        Self {
            config,
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
        }
    }

    pub fn config(&self) -> ChunkedPrefillConfig {
        self.config
    }

    pub fn add(&mut self, state: SeqState) {
        self.waiting.push_back(state);
    }

    /// A preempted sequence goes first: it was admitted before everyone waiting.
    pub fn push_front(&mut self, state: SeqState) {
        self.waiting.push_front(state);
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_prefilling(&self) -> usize {
        self.prefilling.len()
    }

    pub fn waiting(&self) -> impl Iterator<Item = &SeqState> {
        self.waiting.iter()
    }

    /// Reorders the waiting queue by `key`, smallest first, keeping the order of equal keys:
    /// an admission policy other than first come, first served.
    pub fn sort_waiting_by_key<K: Ord>(&mut self, key: impl FnMut(&SeqState) -> K) {
        self.waiting.make_contiguous().sort_by_key(key);
    }

    pub fn prefilling(&self) -> impl Iterator<Item = &ChunkedRequest> {
        self.prefilling.iter()
    }

    pub fn get(&self, id: SeqId) -> Option<&SeqState> {
        self.prefilling
            .iter()
            .map(|r| &r.state)
            .find(|s| s.id() == id)
    }

    /// Takes a sequence out, waiting or prefilling (an abort or a preemption). A prefilling
    /// one still holds its pages: the caller releases them.
    pub fn remove(&mut self, id: SeqId) -> Option<SeqState> {
        if let Some(i) = self.waiting.iter().position(|s| s.id() == id) {
            return self.waiting.remove(i);
        }
        let i = self.prefilling.iter().position(|r| r.state.id() == id)?;
        self.prefilling.remove(i).map(|r| r.state)
    }

    /// Takes the most recently admitted prefilling sequence (the preemption victim of last
    /// resort when decodes run out of pages).
    pub fn pop_newest(&mut self) -> Option<SeqState> {
        let newest = (0..self.prefilling.len()).max_by_key(|&i| self.prefilling[i].state.id())?;
        self.prefilling.remove(newest).map(|r| r.state)
    }

    /// Reserves `n` more slots for a sequence, asking the cache to give pages back if the pool
    /// is short. False when even that is not enough.
    fn reserve(
        state: &mut SeqState,
        n: usize,
        pool: &mut KvPool,
        cache: &mut impl PrefixCache,
    ) -> bool {
        let ps = pool.page_size();
        let need = state
            .own_kv
            .pages_needed(state.num_computed + n - state.kv_len(), ps);
        if need > pool.num_free() {
            cache.evict(pool, need - pool.num_free());
        }
        state.reserve(pool, n).is_ok()
    }

    /// Chooses this step's prefill chunks, given that `num_decoding` sequences decode in it
    /// (each costing one token of the budget and one seat); new prompts are admitted only
    /// when `admit` is true. Slots are reserved on return.
    pub fn schedule(
        &mut self,
        pool: &mut KvPool,
        cache: &mut impl PrefixCache,
        num_decoding: usize,
        admit: bool,
    ) -> Vec<PrefillChunk> {
        // BEGIN SOLUTION
        let cfg = self.config;
        let mut budget = cfg.max_num_batched_tokens.saturating_sub(num_decoding);
        let mut chunks = Vec::new();

        // Prompts in progress, round robin: whoever is served goes to the back.
        let mut served = 0;
        for req in self.prefilling.iter_mut() {
            let n = req.next_chunk(cfg.chunk_size, budget);
            if n == 0 || !Self::reserve(&mut req.state, n, pool, cache) {
                break;
            }
            chunks.push(PrefillChunk {
                seq_id: req.state.id(),
                num_tokens: n,
            });
            budget -= n;
            served += 1;
        }
        self.prefilling.rotate_left(served);

        // New prompts, first come first served, while budget and seats last.
        while admit && budget > 0 && num_decoding + self.prefilling.len() < cfg.max_num_seqs {
            let Some(mut state) = self.waiting.pop_front() else {
                break;
            };
            if state.num_computed == 0 {
                // Never take the whole prompt from the cache: its last token must run to
                // produce the logits of the first new token.
                let tokens = state.seq.all_tokens();
                let (pages, cached) = cache.acquire(pool, state.id(), &tokens[..tokens.len() - 1]);
                state.own_kv = phase1::BlockTable::from_pages(pages, cached);
                state.num_computed = cached;
            }
            let n = state.num_uncomputed().min(cfg.chunk_size).min(budget);
            if !Self::reserve(&mut state, n, pool, cache) {
                // No memory: give back what the cache lent and wait for a later step.
                cache.release(pool, state.id(), &[], &[]);
                let _ = state.release(pool);
                state.num_computed = 0;
                self.waiting.push_front(state);
                break;
            }
            if state.seq.status() == phase0::SequenceStatus::Waiting {
                state.seq.start().expect("a waiting sequence can start");
            }
            chunks.push(PrefillChunk {
                seq_id: state.id(),
                num_tokens: n,
            });
            budget -= n;
            self.prefilling.push_back(ChunkedRequest::new(state));
        }
        chunks
        // END SOLUTION
    }

    /// Records that the chunks ran: their tokens are computed. Returns the sequences whose
    /// prompt is now complete (they sample their first token and move on to decode).
    pub fn complete(&mut self, chunks: &[PrefillChunk]) -> Vec<SeqState> {
        let mut done = Vec::new();
        for chunk in chunks {
            let Some(i) = self
                .prefilling
                .iter()
                .position(|r| r.state.id() == chunk.seq_id)
            else {
                continue;
            };
            self.prefilling[i].state.num_computed += chunk.num_tokens;
            if self.prefilling[i].remaining() == 0 {
                done.extend(self.prefilling.remove(i).map(|r| r.state));
            }
        }
        done
    }
}
