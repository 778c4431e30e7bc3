//! Every request the engine knows, where it is in its life, and when things happened to it.
//!
//! The scheduler decides; the pool remembers: arrival, first token and finish times (the
//! latency figures users feel: time to first token, time per output token), and the finished
//! results until someone collects them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use phase0::{SeqId, SequenceStatus};

/// When a request arrived, got its first token and finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTiming {
    pub arrival: Instant,
    pub first_token: Option<Instant>,
    pub finished: Option<Instant>,
}

impl RequestTiming {
    /// Time to first token.
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token? - self.arrival)
    }

    /// Arrival to last token.
    pub fn latency(&self) -> Option<Duration> {
        Some(self.finished? - self.arrival)
    }

    /// Mean time per output token after the first (`None` with fewer than two tokens).
    pub fn tpot(&self, num_output: usize) -> Option<Duration> {
        if num_output < 2 {
            return None;
        }
        Some((self.finished? - self.first_token?) / (num_output as u32 - 1))
    }
}

#[derive(Debug, Clone)]
struct Record {
    status: SequenceStatus,
    timing: RequestTiming,
}

/// Requests by id: waiting, running, finished.
#[derive(Debug, Default)]
pub struct RequestPool {
    records: HashMap<SeqId, Record>,
}

impl RequestPool {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn arrive(&mut self, id: SeqId, now: Instant) {
        self.records.insert(
            id,
            Record {
                status: SequenceStatus::Waiting,
                timing: RequestTiming {
                    arrival: now,
                    first_token: None,
                    finished: None,
                },
            },
        );
    }

    pub fn set_status(&mut self, id: SeqId, status: SequenceStatus, now: Instant) {
        if let Some(r) = self.records.get_mut(&id) {
            r.status = status;
            if matches!(status, SequenceStatus::Finished(_)) {
                r.timing.finished = Some(now);
            }
        }
    }

    pub fn token(&mut self, id: SeqId, now: Instant) {
        if let Some(r) = self.records.get_mut(&id) {
            r.timing.first_token.get_or_insert(now);
            r.status = SequenceStatus::Running;
        }
    }

    pub fn status(&self, id: SeqId) -> Option<SequenceStatus> {
        self.records.get(&id).map(|r| r.status)
    }

    pub fn timing(&self, id: SeqId) -> Option<RequestTiming> {
        self.records.get(&id).map(|r| r.timing)
    }

    /// Forgets a finished request (after its result was handed out).
    pub fn remove(&mut self, id: SeqId) -> Option<RequestTiming> {
        self.records.remove(&id).map(|r| r.timing)
    }

    fn count(&self, f: impl Fn(SequenceStatus) -> bool) -> usize {
        self.records.values().filter(|r| f(r.status)).count()
    }

    pub fn num_waiting(&self) -> usize {
        self.count(|s| s == SequenceStatus::Waiting)
    }

    pub fn num_running(&self) -> usize {
        self.count(|s| s == SequenceStatus::Running)
    }

    pub fn num_finished(&self) -> usize {
        self.count(|s| matches!(s, SequenceStatus::Finished(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase0::FinishReason;

    #[test]
    fn timings_and_counts_follow_the_life_of_a_request() {
        let t0 = Instant::now();
        let mut pool = RequestPool::new();
        pool.arrive(1, t0);
        pool.arrive(2, t0);
        assert_eq!(pool.num_waiting(), 2);
        pool.token(1, t0 + Duration::from_millis(10));
        pool.token(1, t0 + Duration::from_millis(20));
        pool.token(1, t0 + Duration::from_millis(30));
        assert_eq!((pool.num_waiting(), pool.num_running()), (1, 1));
        pool.set_status(
            1,
            SequenceStatus::Finished(FinishReason::Length),
            t0 + Duration::from_millis(30),
        );
        let t = pool.timing(1).unwrap();
        assert_eq!(t.ttft(), Some(Duration::from_millis(10)));
        assert_eq!(t.tpot(3), Some(Duration::from_millis(10)));
        assert_eq!(t.latency(), Some(Duration::from_millis(30)));
        assert_eq!(pool.num_finished(), 1);
        assert!(pool.remove(1).is_some());
        assert_eq!(pool.status(1), None);
    }
}
