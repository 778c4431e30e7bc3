//! Chapter 6.1: the engine.
//!
//! The public face of nano-serving, in the shape nano-vllm and vLLM users know: [`Config`] and
//! [`LLM`] (generate, the step API, streaming) over the continuous-batching engine of chapter
//! 5. This chapter runs the CPU runner of chapter 2; the chunk API (6.2), the server (6.3) and
//! the CUDA runner (6.4) build on the seams it exposes: [`LLM::from_runner`] for any runner and
//! [`StepDriver`] for how its steps are run.

mod config;
mod driver;
mod error;
#[cfg(feature = "exercises")]
pub mod exercises;
mod llm;
mod logprobs;
mod prompt;
mod runner;
mod stream;

pub use config::{Config, Device, KvCacheDtype};
pub use driver::{OneStepAtATime, StepDriver};
pub use error::Error;
pub use llm::{LLM, StepResult};
pub use logprobs::{LogprobDriver, Logprobs, TokenLogprobs, token_logprobs};
pub use phase0::{FinishReason, SamplingParams, SeqId, TokenId};
pub use phase2::{ChatMessage, GenerationConfig, default_model_dir, models_dir};
pub use prompt::{Output, ParamsList, Prompt};
pub use runner::{Runner, cpu_kv_pages, cpu_runner, load_cpu_model};
pub use stream::{StreamPiece, TokenStream};
