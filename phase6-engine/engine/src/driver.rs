//! How `LLM` runs the steps of its engine.
//!
//! The engine loop of chapter 5 runs one step at a time: schedule, forward, apply the tokens.
//! That is [`OneStepAtATime`]. A runner that queues work on a device can do better by deciding
//! the next step while the current one runs (SGLang's overlap scheduler); such a driver is
//! installed with [`crate::LLM::set_driver`] by the crate that owns that runner.

use phase2::ModelRunner;
use phase5::{Engine, StepOutput};

/// Runs one step of an engine whose runner is a `Box<R>`.
pub trait StepDriver<R: ?Sized + ModelRunner> {
    fn step(&mut self, engine: &mut Engine<Box<R>>) -> Result<StepOutput, phase2::Error>;

    /// Whether a step this driver started is still to be collected: the engine is not done
    /// while one is.
    fn in_flight(&self) -> bool;
}

/// The engine loop as chapter 5 wrote it: each step runs to its end before the next is decided.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneStepAtATime;

impl<R: ?Sized + ModelRunner> StepDriver<R> for OneStepAtATime {
    fn step(&mut self, engine: &mut Engine<Box<R>>) -> Result<StepOutput, phase2::Error> {
        engine.step()
    }

    fn in_flight(&self) -> bool {
        false
    }
}
