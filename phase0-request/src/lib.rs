//! Chapter 0: what a serving engine is asked to do.
//!
//! A user sends a [`Request`]: prompt token ids plus [`SamplingParams`] saying how to pick each
//! next token and when to stop. Inside the engine a request becomes a [`Sequence`] that moves
//! through a small state machine (waiting, running, finished, and back to waiting when it is
//! preempted). Each engine step runs one [`Batch`]: some sequences' prompt pieces (prefill) and
//! some sequences' next token (decode). Every later chapter builds on these types.

mod batch;
mod error;
#[cfg(feature = "exercises")]
pub mod exercises;
mod sampling_params;
mod sequence;

pub use batch::{Batch, BatchEntry, BatchKind, EntryKind};
pub use error::Error;
pub use sampling_params::SamplingParams;
pub use sequence::{FinishReason, Request, SeqId, Sequence, SequenceStatus, TokenId};
