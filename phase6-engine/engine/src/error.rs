//! The engine's errors: one enum for everything a user of `LLM` or `ChunkedLLM` can meet.
//!
//! Lower chapters keep their own error types; here they are sorted into the cases a caller
//! acts on differently (fix the request, fix the model folder, wait for memory, ...).

use std::path::PathBuf;

use phase0::SeqId;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("cannot load model from {}: {reason}", file.display())]
    ModelLoad { file: PathBuf, reason: String },
    #[error("invalid sampling params: {field} = {value} ({reason})")]
    InvalidSamplingParams {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("prompt {index} is empty")]
    EmptyPrompt { index: usize },
    #[error("prompt of {len} tokens is longer than the limit of {max}")]
    PromptTooLong { len: usize, max: usize },
    #[error("out of KV pages: {0}")]
    OutOfMemory(String),
    #[error("{0} sampling params for {1} prompts: give one for all or one per prompt")]
    ParamsCount(usize, usize),
    #[error("no request {0}")]
    UnknownRequest(SeqId),
    #[error("chunk {0} not found (never registered, deleted or evicted)")]
    ChunkNotFound(String),
    #[error("incompatible chunks: {0}")]
    IncompatibleChunks(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("cuda: {0}")]
    Cuda(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A text prompt for a model without a tokenizer (random weights).
    pub fn no_tokenizer() -> Self {
        Error::Tokenizer("this model has no tokenizer: give prompts as token ids".into())
    }
}

impl From<phase0::Error> for Error {
    fn from(e: phase0::Error) -> Self {
        match e {
            phase0::Error::InvalidSamplingParams {
                field,
                value,
                reason,
            } => Error::InvalidSamplingParams {
                field,
                value,
                reason,
            },
            phase0::Error::EmptyPrompt(_) => Error::EmptyPrompt { index: 0 },
            other => Error::Internal(other.to_string()),
        }
    }
}

impl From<phase2::Error> for Error {
    fn from(e: phase2::Error) -> Self {
        match e {
            phase2::Error::ModelLoad { file, reason } => Error::ModelLoad { file, reason },
            phase2::Error::Tokenizer(s) => Error::Tokenizer(s),
            phase2::Error::PromptTooLong { len, max } => Error::PromptTooLong { len, max },
            phase2::Error::OutOfMemory(s) => Error::OutOfMemory(s),
            phase2::Error::Pool(p @ phase1::Error::OutOfPages { .. }) => {
                Error::OutOfMemory(p.to_string())
            }
            phase2::Error::Device(s) => Error::Cuda(s),
            phase2::Error::Request(r) => r.into(),
            other => Error::Internal(other.to_string()),
        }
    }
}
