//! Chapter 2: a real model, prefill and decode.
//!
//! This is where the course starts producing tokens. A Hugging Face Qwen3 folder is loaded
//! (config, memory-mapped safetensors, tokenizer), and a CPU forward pass runs a *batch* of
//! sequences over the paged KV of chapter 1: prefill pieces (many tokens of one prompt,
//! compute-bound) and decode tokens (one per sequence, memory-bound) in the same call.
//! [`ModelRunner`] is the seam between scheduling and math; [`PrefillManager`] and
//! [`DecodeManager`] are the first, simplest scheduling policy on top of it.

pub mod attention;
mod chat_template;
mod config;
mod cpu_runner;
mod decode_manager;
mod error;
#[cfg(feature = "exercises")]
pub mod exercises;
mod fixtures;
mod generation_config;
mod hash_runner;
mod kv_store;
mod model;
mod model_files;
pub mod ops;
mod paths;
mod prefill_manager;
pub mod random_weights;
pub mod rope;
mod runner;
pub mod sampler;
mod seq_state;
mod tokenizer;
mod weights;

pub use chat_template::ChatTemplate;
pub use config::{Architecture, ModelConfig};
pub use cpu_runner::{
    BatchAttention, CpuRunner, LayerAttention, PagedAttention, batch_rows, sampled_rows,
};
pub use decode_manager::{DecodeManager, DecodePlan};
pub use error::Error;
pub use fixtures::{Fixture, FixtureCase};
pub use generation_config::GenerationConfig;
pub use hash_runner::HashRunner;
pub use kv_store::KvStore;
pub use model::{Layer, Model};
pub use paths::{default_model_dir, models_dir};
pub use prefill_manager::{PrefillConfig, PrefillManager};
pub use rope::{RopeFrequencies, RopeScaling};
pub use runner::{
    BatchLimits, ForwardBatch, ForwardSeq, Logits, ModelRunner, SampleSpec, validate_batch,
    validate_segments,
};
pub use seq_state::SeqState;
pub use tokenizer::{ChatMessage, StreamDecoder, Tokenizer};
pub use weights::{Dtype, TensorView, Weights, tensor_shapes};
