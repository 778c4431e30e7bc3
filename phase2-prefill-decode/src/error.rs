//! The errors of chapter 2: loading a model folder, and running it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A model folder problem; names the file and what is wrong with it.
    #[error("cannot load model from {}: {reason}", file.display())]
    ModelLoad { file: PathBuf, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A prompt that can never be scheduled under the configured limits.
    #[error("prompt of {len} tokens is longer than the limit of {max}")]
    PromptTooLong { len: usize, max: usize },
    /// No KV page left for work that must run; chapter 5 preempts instead where it can.
    #[error("out of KV pages: {0}")]
    OutOfMemory(String),
    /// A batch the runner cannot execute (wrong page counts, positions past the model's limit).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// A failure of the compute device (a CUDA call, a kernel compile, device memory).
    #[error("device: {0}")]
    Device(String),
    #[error(transparent)]
    Request(#[from] phase0::Error),
    #[error(transparent)]
    Pool(#[from] phase1::Error),
}

impl Error {
    pub fn model_load(file: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::ModelLoad {
            file: file.into(),
            reason: reason.into(),
        }
    }
}
