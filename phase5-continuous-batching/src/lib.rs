//! Chapter 5: continuous batching.
//!
//! Static batching runs a batch of requests until the longest one finishes; every slot freed
//! by a short answer idles until then. Orca's iteration-level scheduling (vLLM's continuous
//! batching) decides the batch again at every step: finished sequences leave at once,
//! waiting ones join as soon as budget and pages allow, and when decode runs out of pages the
//! newest running sequence is *preempted*: its pages are released (its computed prefix goes
//! to the radix cache) and it is recomputed later, instead of the engine failing.

mod config;
mod engine;
#[cfg(feature = "exercises")]
pub mod exercises;
mod request_pool;
mod scheduler;

pub use config::{Batching, SchedulerConfig};
pub use engine::{Engine, FinishedRequest, StepOutput, StreamEvent};
pub use request_pool::{RequestPool, RequestTiming};
pub use scheduler::{OptionalCache, Scheduler};
