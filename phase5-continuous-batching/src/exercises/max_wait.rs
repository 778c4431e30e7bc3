//! Exercise 5.2: shortest job first with a bound on waiting.
//!
//! Build: [`MaxWait`], shortest job first with one exception: a request that has waited
//! more than `max_wait` steps since it arrived goes to the front, the longest-waiting first.
//!
//! Why: shortest job first starves long requests under load, and a server must give every
//! request an answer in bounded time. Ageing (a priority that grows with waiting time) is the
//! classic fix; a hard bound is the simplest ageing there is and gives a guarantee a service
//! level can be written against, while most of the mean-latency gain stays.
//!
//! Checked by `cargo test -p phase5 --features exercises --test exercises max_wait`.

use std::collections::HashMap;

use phase0::SeqId;

use crate::Scheduler;

/// Shortest job first, except for requests that waited too long.
#[derive(Debug, Clone)]
pub struct MaxWait {
    /// Steps a request may wait before it goes ahead of shorter ones.
    pub max_wait: u64,
    /// The step at which each known request arrived.
    arrivals: HashMap<SeqId, u64>,
}

impl MaxWait {
    pub fn new(max_wait: u64) -> Self {
        Self {
            max_wait,
            arrivals: HashMap::new(),
        }
    }

    /// Records that request `id` arrived at step `step` (call it when you add the request).
    pub fn arrived(&mut self, id: SeqId, step: u64) {
        self.arrivals.insert(id, step);
    }

    /// Forgets a request that finished.
    pub fn finished(&mut self, id: SeqId) {
        self.arrivals.remove(&id);
    }

    /// Reorders the waiting queue before step `now`: requests that arrived more than
    /// `max_wait` steps ago first, earliest arrival first; then the others by job size
    /// (exercise 5.1), equal ones in their order. A request it never saw arrive counts as
    /// arriving now.
    pub fn order(&self, scheduler: &mut Scheduler, now: u64) {
        if !cfg!(feature = "solutions") {
            todo!("exercise 5.2: overdue requests first, oldest first, then shortest job first");
        }
        // BEGIN SOLUTION
        scheduler.sort_waiting_by_key(|state| {
            let arrival = self.arrivals.get(&state.id()).copied().unwrap_or(now);
            if now.saturating_sub(arrival) > self.max_wait {
                (0, arrival as usize)
            } else {
                (1, super::shortest_job_first::job_size(state))
            }
        });
        // END SOLUTION
    }
}
