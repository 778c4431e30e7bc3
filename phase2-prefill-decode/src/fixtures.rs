//! The reference outputs of Hugging Face `transformers` that the model is checked against
//! (`models/fixtures/*.json`, written by `tools/reference_outputs.py`): for each prompt, the
//! last prefill logits and the greedy continuation with the top-2 logit gap of each step.

use std::path::Path;

use phase0::TokenId;
use serde::Deserialize;

use crate::error::Error;

/// One fixture file: the model folder it was made with (relative to `models/`) and its cases.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Fixture {
    pub model_dir: String,
    pub cases: Vec<FixtureCase>,
}

/// One prompt of a fixture.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FixtureCase {
    pub name: String,
    /// The prompt as text, where the fixture was made from text.
    #[serde(rename = "prompt_text", default)]
    pub text: Option<String>,
    #[serde(rename = "prompt_ids")]
    pub prompt: Vec<TokenId>,
    /// The greedy tokens after the prompt.
    #[serde(rename = "greedy_ids")]
    pub greedy: Vec<TokenId>,
    /// The gap between the two largest logits at each greedy step: where it is small, rounding
    /// may swap the two.
    #[serde(rename = "greedy_top2_gaps")]
    pub gaps: Vec<f32>,
    /// The logits after the prompt's last token.
    #[serde(rename = "last_logits")]
    pub logits: Vec<f32>,
}

impl Fixture {
    pub fn read(path: &Path) -> Result<Self, Error> {
        let load = |reason: String| Error::ModelLoad {
            file: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| load(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| load(e.to_string()))
    }

    /// The case called `name`.
    pub fn case(&self, name: &str) -> Option<&FixtureCase> {
        self.cases.iter().find(|c| c.name == name)
    }
}
