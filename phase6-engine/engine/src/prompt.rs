//! What `generate` takes and returns: prompts as text or token ids, sampling params for all or
//! per prompt, and one output per prompt.

use phase0::{FinishReason, SamplingParams, TokenId};

/// A prompt: text (tokenized by the model's tokenizer) or token ids as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<TokenId>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Self {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Self {
        Prompt::Text(s)
    }
}

impl From<&String> for Prompt {
    fn from(s: &String) -> Self {
        Prompt::Text(s.clone())
    }
}

impl From<Vec<TokenId>> for Prompt {
    fn from(ids: Vec<TokenId>) -> Self {
        Prompt::Tokens(ids)
    }
}

impl From<&[TokenId]> for Prompt {
    fn from(ids: &[TokenId]) -> Self {
        Prompt::Tokens(ids.to_vec())
    }
}

/// Sampling params for a `generate` call: one for every prompt, or one per prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamsList {
    One(SamplingParams),
    PerPrompt(Vec<SamplingParams>),
}

impl ParamsList {
    /// The params of prompt `i` of `n`, or an error when the counts disagree.
    pub fn expand(self, n: usize) -> Result<Vec<SamplingParams>, crate::Error> {
        match self {
            ParamsList::One(p) => Ok(vec![p; n]),
            ParamsList::PerPrompt(v) if v.len() == n => Ok(v),
            ParamsList::PerPrompt(v) => Err(crate::Error::ParamsCount(v.len(), n)),
        }
    }
}

impl From<SamplingParams> for ParamsList {
    fn from(p: SamplingParams) -> Self {
        ParamsList::One(p)
    }
}

impl From<&SamplingParams> for ParamsList {
    fn from(p: &SamplingParams) -> Self {
        ParamsList::One(p.clone())
    }
}

impl From<Vec<SamplingParams>> for ParamsList {
    fn from(v: Vec<SamplingParams>) -> Self {
        ParamsList::PerPrompt(v)
    }
}

/// The result of one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The generated text, special tokens left out (empty without a tokenizer).
    pub text: String,
    /// The generated token ids, the stopping token included.
    pub token_ids: Vec<TokenId>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}
