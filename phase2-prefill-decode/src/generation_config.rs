//! Chapter 2: `generation_config.json`, the model author's defaults for generating: which ids
//! end a generation, and the sampling parameters a request gets when it names none.
//!
//! This is vLLM's `--generation-config auto` (its default): `temperature`, `top_p` and `top_k`
//! from the file replace the engine's own defaults, and `max_new_tokens` caps the default
//! length (a request, or a command line, that sets a value always wins). Like vLLM, `do_sample`
//! is not read, and fields this engine has no sampler for (`repetition_penalty`, `min_p`) are
//! ignored. This module is the one place the file is read.

use std::path::Path;

use phase0::SamplingParams;
use serde::Deserialize;

use crate::config::eos_ids;
use crate::error::Error;
use crate::model_files::read_json;

/// The parts of `generation_config.json` the engine uses; `None` where the file says nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id`: one id or a list (Llama 3.1 lists end of text, end of message and end of
    /// turn: `[128001, 128008, 128009]`).
    pub eos_token_ids: Vec<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Top-k, with `transformers`' "0 disables it" turned into this engine's -1.
    pub top_k: Option<i32>,
    pub max_new_tokens: Option<usize>,
}

#[derive(Deserialize)]
struct RawGenerationConfig {
    eos_token_id: Option<serde_json::Value>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; a folder without one has no defaults.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        let path = dir.join("generation_config.json");
        match read_json(&path)? {
            Some(value) => Self::from_value(value, &path),
            None => Ok(Self::default()),
        }
    }

    /// Parses the file's JSON; `path` is only used in error messages. Values the engine would
    /// refuse (a `top_p` of 0) are an error naming the file, not a failure at the first request.
    pub fn from_value(value: serde_json::Value, path: &Path) -> Result<Self, Error> {
        let raw: RawGenerationConfig = serde_json::from_value(value)
            .map_err(|e| Error::model_load(path, format!("bad field: {e}")))?;
        let config = Self {
            eos_token_ids: eos_ids(raw.eos_token_id.as_ref()),
            temperature: raw.temperature,
            top_p: raw.top_p,
            top_k: raw.top_k.map(|k| {
                if k <= 0 {
                    -1
                } else {
                    k.min(i32::MAX as i64) as i32
                }
            }),
            max_new_tokens: raw.max_new_tokens,
        };
        config
            .default_sampling_params()
            .validate()
            .map_err(|e| Error::model_load(path, e.to_string()))?;
        Ok(config)
    }

    /// `SamplingParams::default()` with the model's values in place of the engine's: what a
    /// request that sets nothing runs with (vLLM's `get_default_sampling_params`).
    pub fn default_sampling_params(&self) -> SamplingParams {
        let engine = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(engine.temperature),
            top_p: self.top_p.unwrap_or(engine.top_p),
            top_k: self.top_k.unwrap_or(engine.top_k),
            max_tokens: self.default_max_tokens(engine.max_tokens),
            ..engine
        }
    }

    /// The length a request gets when it sets none: the caller's default, capped by the model's
    /// `max_new_tokens` (vLLM takes the smaller of the two, so the file never lengthens a
    /// default).
    pub fn default_max_tokens(&self, fallback: usize) -> usize {
        self.max_new_tokens.map_or(fallback, |m| m.min(fallback))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<GenerationConfig, Error> {
        GenerationConfig::from_value(
            serde_json::from_str(json).unwrap(),
            Path::new("generation_config.json"),
        )
    }

    #[test]
    fn llama_3_1_lists_three_end_ids_and_sampling_defaults() {
        let g = parse(
            r#"{"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
                "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.42.3"}"#,
        )
        .unwrap();
        assert_eq!(g.eos_token_ids, vec![128001, 128008, 128009]);
        let p = g.default_sampling_params();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.6, 0.9, -1));
        assert_eq!(p.max_tokens, 16, "no max_new_tokens: the engine's default");
    }

    #[test]
    fn max_new_tokens_caps_the_default_and_top_k_zero_disables() {
        let g = parse(r#"{"eos_token_id": 2, "top_k": 0, "max_new_tokens": 256}"#).unwrap();
        assert_eq!(g.top_k, Some(-1));
        assert_eq!(g.default_max_tokens(16), 16);
        assert_eq!(g.default_max_tokens(4096), 256);
        assert_eq!(GenerationConfig::default().default_max_tokens(100), 100);
    }

    #[test]
    fn bad_values_name_the_file() {
        for json in [r#"{"top_p": 0}"#, r#"{"temperature": "hot"}"#] {
            let err = parse(json).unwrap_err().to_string();
            assert!(err.contains("generation_config.json"), "{err}");
        }
    }
}
