//! Exercise 6.1.1: a bound on how many steps a request may take part in, as a step driver.
//!
//! Build: [`StepLimit`], a [`StepDriver`] that runs each step as chapter 5's loop does and
//! then aborts every request that has now been in `max_steps` steps without finishing, handing
//! it to the caller as finished (`FinishReason::Aborted`) with the tokens it produced.
//!
//! Why: a server answers within a time limit, and a request nobody will wait for should give
//! its seat and pages back rather than run to `max_tokens`. Counting steps instead of seconds
//! makes the policy exact and testable; the driver seam means `LLM` needs no change for it.
//!
//! Checked by `cargo test -p phase6 --features exercises --test exercises step_limit`.

use std::collections::HashMap;

use phase0::SeqId;
use phase2::ModelRunner;
use phase5::{Engine, StepOutput};

use crate::StepDriver;

/// Runs steps one at a time and aborts a request once it has been in `max_steps` of them.
#[derive(Debug, Clone)]
pub struct StepLimit {
    max_steps: usize,
    /// How many steps each unfinished request has been in so far.
    steps: HashMap<SeqId, usize>,
}

impl StepLimit {
    /// A limit of `max_steps` steps per request (at least 1).
    pub fn new(max_steps: usize) -> Self {
        assert!(max_steps > 0, "a request must be allowed one step");
        Self {
            max_steps,
            steps: HashMap::new(),
        }
    }

    /// The limit.
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }
}

impl<R: ?Sized + ModelRunner> StepDriver<R> for StepLimit {
    /// One step of `engine`; then each request of the step's batch counts one more step, and
    /// those that reached the limit unfinished are aborted and added to the step's finished
    /// requests. A request is forgotten once it finishes.
    fn step(&mut self, engine: &mut Engine<Box<R>>) -> Result<StepOutput, phase2::Error> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 6.1.1: one step, then abort the requests that reached max_steps");
        }
        // BEGIN SOLUTION
        let mut out = engine.step()?;
        let finished: Vec<SeqId> = out.finished.iter().map(|f| f.id).collect();
        let mut over = Vec::new();
        for entry in out.plan.entries() {
            let steps = self.steps.entry(entry.seq_id).or_insert(0);
            *steps += 1;
            if *steps >= self.max_steps && !finished.contains(&entry.seq_id) {
                over.push(entry.seq_id);
            }
        }
        for id in finished.iter().chain(&over) {
            self.steps.remove(id);
        }
        for id in over {
            out.finished.extend(engine.abort(id));
        }
        Ok(out)
        // END SOLUTION
    }

    fn in_flight(&self) -> bool {
        false
    }
}
