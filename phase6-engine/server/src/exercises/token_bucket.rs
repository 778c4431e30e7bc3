//! Exercise 6.3.1: a token bucket, to limit how many tokens one API key may ask for.
//!
//! Build: [`TokenBucket`]: it holds up to `capacity` tokens and refills at `refill_per_sec`;
//! a request for `n` tokens takes them if they are there, and otherwise says how long until
//! they will be, which the server turns into `429 Too Many Requests` with `Retry-After`.
//!
//! Why: one client that sends thousands of long requests fills the batch and every other
//! client's time to first token grows. Public LLM APIs limit tokens per minute per key; a
//! bucket allows short bursts (up to its capacity) while holding the average to its rate.
//!
//! Checked by `cargo test -p phase6-server --features exercises --test exercises token_bucket`.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    refill_per_sec: f64,
    /// Tokens in the bucket at `last`.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    last: Duration,
}

impl TokenBucket {
    /// A full bucket at time zero. `refill_per_sec` must be positive.
    pub fn new(capacity: u64, refill_per_sec: f64) -> Self {
        assert!(refill_per_sec > 0.0, "a bucket that never refills");
        Self {
            capacity: capacity as f64,
            refill_per_sec,
            tokens: capacity as f64,
            last: Duration::ZERO,
        }
    }

    /// Tokens in the bucket at `now` (time since an arbitrary start, as
    /// [`try_take`](Self::try_take) takes it), without taking any.
    pub fn available(&mut self, now: Duration) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// Takes `n` tokens at time `now`, or returns how long to wait until `n` are there (and
    /// takes nothing). A request larger than the capacity can never pass: `Duration::MAX`.
    /// A `now` earlier than a time already seen counts as no time passing.
    pub fn try_take(&mut self, n: u64, now: Duration) -> Result<(), Duration> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.3.1: refill, then take n tokens or say how long to wait");
        }
        // BEGIN SOLUTION
        let n = n as f64;
        if n > self.capacity {
            return Err(Duration::MAX);
        }
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            (n - self.tokens) / self.refill_per_sec,
        ))
        // END SOLUTION
    }

    /// Adds what flowed in since `last`, up to the capacity.
    fn refill(&mut self, now: Duration) {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.3.1: add what flowed in since the last update, up to the capacity");
        }
        // BEGIN SOLUTION
        if now > self.last {
            let gained = (now - self.last).as_secs_f64() * self.refill_per_sec;
            self.tokens = (self.tokens + gained).min(self.capacity);
            self.last = now;
        }
        // END SOLUTION
    }
}
