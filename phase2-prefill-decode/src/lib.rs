//! Chapter 2: a real model, prefill and decode.
//!
//! This is where the course starts producing tokens. A Hugging Face Qwen3 folder is loaded
//! (config, memory-mapped safetensors, tokenizer), and a CPU forward pass runs a *batch* of
//! sequences over the paged KV of chapter 1: prefill pieces (many tokens of one prompt,
//! compute-bound) and decode tokens (one per sequence, memory-bound) in the same call.
//! [`ModelRunner`] is the seam between scheduling and math; [`PrefillManager`] and
//! [`DecodeManager`] are the first, simplest scheduling policy on top of it.

mod error;
mod runner;
pub mod sampler;

pub use error::Error;
pub use runner::{ForwardBatch, ForwardSeq, Logits, ModelRunner, SampleSpec, SharedSegment};
