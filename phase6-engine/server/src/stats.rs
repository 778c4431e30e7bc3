//! The numbers `/metrics` reports, kept by the engine thread: gauges read off the engine when
//! asked (seats, queue, KV pages, cache hit rate) and counters the thread adds to as requests
//! come and go (tokens, finishes by reason). Tokens per second is taken over the last ten
//! seconds, so it falls back to zero when the server goes idle.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use phase1::PageId;

use crate::active::Ended;
use phase6_chunks::ChunkedLLM;
use phase6_openai::Finish;

const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Requests that left the engine, by why.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinishCounts {
    /// EOS, a stop token or a stop string.
    pub stop: u64,
    /// `max_tokens` or the model's length limit.
    pub length: u64,
    /// The client went away first.
    pub abort: u64,
    /// The engine failed the request.
    pub error: u64,
}

/// One look at the engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_pages_total: usize,
    /// Pages with at least one holder: requests, the prefix cache, chunks.
    pub kv_pages_used: usize,
    /// Pages the prefix cache holds (some may be shared with running requests).
    pub kv_pages_cached: usize,
    /// Pages the chunk API holds for chunk K/V.
    pub kv_pages_chunks: usize,
    /// Holds on pages by requests in flight (a page two requests share counts twice): zero
    /// whenever no request runs, or pages have leaked.
    pub kv_page_holds_requests: usize,
    pub kv_page_size: usize,
    /// Fraction of looked-up prompt tokens found in the prefix cache; `None` when it is off.
    pub prefix_cache_hit_rate: Option<f64>,
    pub preemptions_total: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub generation_tokens_per_second: f64,
    pub requests_rejected_total: u64,
    pub requests_finished_total: FinishCounts,
}

#[derive(Debug)]
pub struct Counters {
    started: Instant,
    prompt_tokens: u64,
    generated: u64,
    /// Tokens produced per forwarding round within the rate window.
    recent: VecDeque<(Instant, u64)>,
    rejected: u64,
    finished: FinishCounts,
}

impl Counters {
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            prompt_tokens: 0,
            generated: 0,
            recent: VecDeque::new(),
            rejected: 0,
            finished: FinishCounts::default(),
        }
    }

    pub fn admitted(&mut self, prompt_tokens: usize) {
        self.prompt_tokens += prompt_tokens as u64;
    }

    pub fn rejected(&mut self) {
        self.rejected += 1;
    }

    pub fn generated(&mut self, n: usize, now: Instant) {
        if n > 0 {
            self.generated += n as u64;
            self.recent.push_back((now, n as u64));
            self.forget_before(now);
        }
    }

    pub fn ended(&mut self, how: Ended) {
        let f = &mut self.finished;
        match how {
            Ended::Finished(Finish::Stop) | Ended::StopString => f.stop += 1,
            Ended::Finished(Finish::Length) => f.length += 1,
            Ended::ClientGone => f.abort += 1,
            Ended::Failed => f.error += 1,
        }
    }

    fn forget_before(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            self.recent.pop_front();
        }
    }

    fn tokens_per_second(&mut self, now: Instant) -> f64 {
        self.forget_before(now);
        let span = now.duration_since(self.started).min(RATE_WINDOW);
        let tokens: u64 = self.recent.iter().map(|(_, n)| n).sum();
        if span.is_zero() {
            0.0
        } else {
            tokens as f64 / span.as_secs_f64()
        }
    }

    pub fn snapshot(&mut self, model: &ChunkedLLM, now: Instant) -> EngineStats {
        let scheduler = model.llm().engine().scheduler();
        let pool = scheduler.pool();
        let cache = scheduler.cache_stats();
        let cached = cache.map_or(0, |c| c.pages_held as usize);
        let chunks = model.kv_pages_held();
        // Every holder holds a page once: the cache and the chunk store one hold per page
        // they keep; whatever else holds pages is a request.
        let holds: usize = (0..pool.num_pages() as PageId)
            .map(|p| pool.ref_count(p).map_or(0, |n| n as usize))
            .sum();
        EngineStats {
            running: scheduler.num_running(),
            waiting: scheduler.num_waiting(),
            kv_pages_total: pool.num_pages(),
            kv_pages_used: pool.num_used(),
            kv_pages_cached: cached,
            kv_pages_chunks: chunks,
            kv_page_holds_requests: holds.saturating_sub(cached + chunks),
            kv_page_size: pool.page_size(),
            prefix_cache_hit_rate: cache.map(|c| c.hit_rate()),
            preemptions_total: scheduler.num_preemptions(),
            prompt_tokens_total: self.prompt_tokens,
            generation_tokens_total: self.generated,
            generation_tokens_per_second: self.tokens_per_second(now),
            requests_rejected_total: self.rejected,
            requests_finished_total: self.finished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_covers_the_last_ten_seconds() {
        let t0 = Instant::now();
        let mut c = Counters::new(t0);
        c.generated(40, t0 + Duration::from_secs(2));
        c.generated(60, t0 + Duration::from_secs(4));
        assert_eq!(c.tokens_per_second(t0 + Duration::from_secs(5)), 20.0);
        assert_eq!(c.tokens_per_second(t0 + Duration::from_secs(13)), 6.0);
        assert_eq!(c.tokens_per_second(t0 + Duration::from_secs(30)), 0.0);
        assert_eq!(c.generated, 100);
        c.ended(Ended::StopString);
        c.ended(Ended::Finished(Finish::Stop));
        c.ended(Ended::ClientGone);
        assert_eq!(
            c.finished,
            FinishCounts {
                stop: 2,
                length: 0,
                abort: 1,
                error: 0
            }
        );
    }
}
