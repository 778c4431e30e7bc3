//! How to choose each next token and when to stop: the knobs every OpenAI-style API exposes.

use crate::error::Error;
use crate::sequence::TokenId;

/// Sampling settings of one request, with the defaults vLLM and nano-vllm use.
///
/// `temperature == 0` means greedy decoding. `top_k == -1` disables top-k; `top_p == 1.0`
/// disables nucleus sampling. A `seed` makes sampled output reproducible.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub seed: Option<u64>,
    pub stop_token_ids: Vec<TokenId>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            max_tokens: 16,
            ignore_eos: false,
            seed: None,
            stop_token_ids: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0) with the other defaults.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub fn with_max_tokens(mut self, max_tokens: usize) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = temperature;
        self
    }

    pub fn with_top_p(mut self, top_p: f32) -> Self {
        self.top_p = top_p;
        self
    }

    pub fn with_top_k(mut self, top_k: i32) -> Self {
        self.top_k = top_k;
        self
    }

    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    pub fn with_ignore_eos(mut self, ignore_eos: bool) -> Self {
        self.ignore_eos = ignore_eos;
        self
    }

    pub fn with_stop_token_ids(mut self, ids: Vec<TokenId>) -> Self {
        self.stop_token_ids = ids;
        self
    }

    /// True when the next token is simply the most likely one.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field's range; the error names the first bad field.
    pub fn validate(&self) -> Result<(), Error> {
        // BEGIN SOLUTION
        let bad = |field, value: String, reason| {
            Err(Error::InvalidSamplingParams {
                field,
                value,
                reason,
            })
        };
        // `is_finite` also rejects NaN, which no comparison would.
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad(
                "temperature",
                self.temperature.to_string(),
                "must be a finite number >= 0",
            );
        }
        if self.top_p.is_nan() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return bad("top_p", self.top_p.to_string(), "must be in (0, 1]");
        }
        if self.top_k == 0 || self.top_k < -1 {
            return bad(
                "top_k",
                self.top_k.to_string(),
                "must be -1 (disabled) or >= 1",
            );
        }
        if self.max_tokens == 0 {
            return bad("max_tokens", "0".into(), "must be >= 1");
        }
        Ok(())
        // END SOLUTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_reference_api() {
        let p = SamplingParams::default();
        assert_eq!(p.temperature, 1.0);
        assert_eq!(p.top_p, 1.0);
        assert_eq!(p.top_k, -1);
        assert_eq!(p.max_tokens, 16);
        assert!(!p.ignore_eos);
        assert_eq!(p.seed, None);
        assert!(p.stop_token_ids.is_empty());
        assert!(p.validate().is_ok());
        assert!(SamplingParams::greedy().is_greedy());
    }

    fn field_of(p: SamplingParams) -> &'static str {
        match p.validate() {
            Err(Error::InvalidSamplingParams { field, .. }) => field,
            other => panic!("expected InvalidSamplingParams, got {other:?}"),
        }
    }

    #[test]
    fn each_bad_value_names_its_field() {
        let d = SamplingParams::default;
        assert_eq!(field_of(d().with_temperature(-0.1)), "temperature");
        assert_eq!(field_of(d().with_temperature(f32::NAN)), "temperature");
        assert_eq!(field_of(d().with_temperature(f32::INFINITY)), "temperature");
        assert_eq!(field_of(d().with_top_p(0.0)), "top_p");
        assert_eq!(field_of(d().with_top_p(1.01)), "top_p");
        assert_eq!(field_of(d().with_top_p(f32::NAN)), "top_p");
        assert_eq!(field_of(d().with_top_k(0)), "top_k");
        assert_eq!(field_of(d().with_top_k(-2)), "top_k");
        assert_eq!(field_of(d().with_max_tokens(0)), "max_tokens");
    }

    #[test]
    fn edge_values_are_accepted() {
        let d = SamplingParams::default;
        for p in [
            d().with_temperature(0.0),
            d().with_top_p(1.0),
            d().with_top_p(1e-6),
            d().with_top_k(1),
            d().with_top_k(-1),
            d().with_max_tokens(1),
        ] {
            assert!(p.validate().is_ok(), "{p:?} should be valid");
        }
    }

    #[test]
    fn error_message_is_readable() {
        let err = SamplingParams::default()
            .with_top_p(2.0)
            .validate()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid sampling params: top_p = 2 (must be in (0, 1])"
        );
    }
}
