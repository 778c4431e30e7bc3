//! Chapter 3: chunked prefill.
//!
//! In chapter 2 a prompt is prefilled whole, in one step. A 4,000-token prompt then makes that
//! step long, and every running sequence waits for it before its next token: the time between
//! tokens spikes for everyone. Chunked prefill (Sarathi-Serve, vLLM's `enable_chunked_prefill`)
//! splits long prompts into chunks of at most `chunk_size` tokens spread over several steps,
//! and each step first reserves room for the running decodes, then fills what is left of its
//! token budget with prompt chunks, round robin. Steps stay short and evenly sized; decoding
//! never stalls.

mod chunked_prefill;
mod chunked_request;
#[cfg(feature = "exercises")]
pub mod exercises;
mod prefix_cache;
mod scheduler;

pub use chunked_prefill::{ChunkedPrefillConfig, ChunkedPrefillManager, PrefillChunk};
pub use chunked_request::ChunkedRequest;
pub use prefix_cache::{NoPrefixCache, PrefixCache};
pub use scheduler::{ChunkedScheduler, Scheduled, StepOutcome};
