//! The model's shape, read from a Hugging Face `config.json`.
//!
//! Qwen3 is the first-class architecture (RMSNorm, RoPE, grouped-query attention with an
//! RMSNorm on each query and key head, SwiGLU MLP). Qwen2/2.5, Llama 3.x and Mistral differ only
//! in small ways handled by two flags: Qwen2 has biases on the q/k/v projections and no q/k
//! norm; Llama and Mistral have neither. Both spellings of newer and older `transformers` files
//! are accepted (`rope_theta` and `rope_scaling`, or `rope_parameters` holding both;
//! `torch_dtype` or `dtype`). Long-context RoPE scaling is read here and turned into the
//! frequency table once (see [`crate::rope`]).

use std::path::Path;

use serde::Deserialize;

use crate::error::Error;
use crate::rope::{RopeFrequencies, RopeScaling};

/// The decoder families this crate runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Qwen3,
    Qwen2,
    Llama,
    Mistral,
}

/// Everything the forward pass needs to know about the model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    /// The long-context rescaling the config asks for.
    pub rope_scaling: RopeScaling,
    /// The rotation table, computed once from `rope_theta` and `rope_scaling`.
    pub rope: RopeFrequencies,
    pub max_position_embeddings: usize,
    /// Sliding-window attention's window, where the config enables one: this engine attends to
    /// the whole context, so the engine refuses contexts longer than the window.
    pub sliding_window: Option<usize>,
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm on every query and key head before RoPE (Qwen3).
    pub qk_norm: bool,
    /// End-of-sequence ids named by the config (the tokenizer may add more).
    pub eos_token_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct RawConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    sliding_window: Option<usize>,
    use_sliding_window: Option<bool>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    eos_token_id: Option<serde_json::Value>,
}

/// Reads an `eos_token_id` field: one id or a list of ids.
pub(crate) fn eos_ids(value: Option<&serde_json::Value>) -> Vec<u32> {
    match value {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| v as u32).into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|v| v as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// Reads `config.json`; every error names the file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let text =
            std::fs::read_to_string(path).map_err(|e| Error::model_load(path, e.to_string()))?;
        Self::from_json(&text, path)
    }

    /// Parses config JSON; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Self, Error> {
        let raw: RawConfig = serde_json::from_str(text)
            .map_err(|e| Error::model_load(path, format!("bad JSON: {e}")))?;
        let name = raw
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or(raw.model_type.clone())
            .unwrap_or_default();
        let architecture = match name.as_str() {
            "Qwen3ForCausalLM" | "qwen3" => Architecture::Qwen3,
            "Qwen2ForCausalLM" | "qwen2" => Architecture::Qwen2,
            "LlamaForCausalLM" | "llama" => Architecture::Llama,
            "MistralForCausalLM" | "mistral" => Architecture::Mistral,
            other => {
                return Err(Error::model_load(
                    path,
                    format!(
                        "unknown architecture {other:?} (supported: Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM, MistralForCausalLM)"
                    ),
                ));
            }
        };
        let bad = |reason: String| Err(Error::model_load(path, reason));
        let parameters = raw.rope_parameters.as_ref().filter(|v| !v.is_null());
        let rope_theta = raw
            .rope_theta
            .or(parameters.and_then(|p| p.get("rope_theta")?.as_f64()))
            .unwrap_or(10_000.0);
        // The older `rope_scaling` wins where both are written: transformers 5 derives
        // `rope_parameters` from it.
        let rope_scaling = match raw
            .rope_scaling
            .as_ref()
            .filter(|v| !v.is_null())
            .or(parameters)
        {
            Some(v) => match RopeScaling::from_json(v, raw.max_position_embeddings) {
                Ok(s) => s,
                Err(reason) => return bad(reason),
            },
            None => RopeScaling::None,
        };
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
        if raw.num_attention_heads == 0
            || num_kv_heads == 0
            || !raw.num_attention_heads.is_multiple_of(num_kv_heads)
        {
            return bad(format!(
                "num_attention_heads {} must be a positive multiple of num_key_value_heads {num_kv_heads}",
                raw.num_attention_heads
            ));
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {head_dim} must be even (RoPE rotates pairs)"
            ));
        }
        Ok(Self {
            architecture,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: rope_theta as f32,
            rope: RopeFrequencies::new(head_dim, rope_theta, &rope_scaling),
            max_position_embeddings: match rope_scaling {
                // YaRN configs keep the trained length here; the scaled context is the factor
                // times the original (how vLLM derives its longest context too).
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    ..
                } => raw
                    .max_position_embeddings
                    .max((factor * original) as usize),
                _ => raw.max_position_embeddings,
            },
            rope_scaling,
            // Qwen2/3 configs carry a window with `use_sliding_window: false`; Mistral has no
            // switch: a window that is set is used.
            sliding_window: raw
                .sliding_window
                .filter(|_| raw.use_sliding_window != Some(false)),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: raw
                .attention_bias
                .unwrap_or(architecture == Architecture::Qwen2),
            qk_norm: architecture == Architecture::Qwen3,
            eos_token_ids: eos_ids(raw.eos_token_id.as_ref()),
        })
    }

    /// Query heads per KV head (grouped-query attention).
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Width of the fused q|k|v projection output.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }

    /// Parameters, embedding included once when tied.
    pub fn num_parameters(&self) -> usize {
        let (h, d, i) = (self.hidden_size, self.head_dim, self.intermediate_size);
        let attn = h * self.qkv_width() + self.num_heads * d * h;
        let bias = if self.qkv_bias { self.qkv_width() } else { 0 };
        let norms = 2 * h + if self.qk_norm { 2 * d } else { 0 };
        let per_layer = attn + bias + 3 * h * i + norms;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        self.num_layers * per_layer + embed + head + h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":151936,
        "hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,
        "num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
        "rope_theta":1000000,"max_position_embeddings":40960,"tie_word_embeddings":true,
        "eos_token_id":151645}"#;

    #[test]
    fn qwen3_0_6b_shape() {
        let c = ModelConfig::from_json(QWEN3, Path::new("config.json")).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3);
        assert_eq!((c.group_size(), c.qkv_width()), (2, 4096));
        assert!(c.qk_norm && !c.qkv_bias && c.tie_word_embeddings);
        assert_eq!(c.eos_token_ids, vec![151645]);
        // 596M parameters with the tied embedding counted once (the published 0.6B).
        assert_eq!(c.num_parameters() / 1_000_000, 596);
    }

    #[test]
    fn newer_rope_spelling_and_llama_defaults() {
        let text = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":10,"hidden_size":8,
            "intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
            "rms_norm_eps":1e-5,"rope_parameters":{"rope_theta":500000.0,"rope_type":"default"},
            "max_position_embeddings":64}"#;
        let c = ModelConfig::from_json(text, Path::new("c.json")).unwrap();
        assert_eq!((c.rope_theta, c.head_dim, c.num_kv_heads), (500000.0, 4, 2));
        assert!(!c.qk_norm && !c.qkv_bias && !c.tie_word_embeddings);
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let err = ModelConfig::from_json("{", Path::new("/m/config.json")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot load model from /m/config.json: bad JSON"),
            "{err}"
        );
        let gpt = QWEN3.replace("Qwen3ForCausalLM", "GPT2LMHeadModel");
        let err = ModelConfig::from_json(&gpt, Path::new("/m/config.json")).unwrap_err();
        assert!(
            err.to_string()
                .contains("unknown architecture \"GPT2LMHeadModel\""),
            "{err}"
        );
        let scaled = QWEN3.replace(
            "\"eos_token_id\"",
            "\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2.0},\"eos_token_id\"",
        );
        let err = ModelConfig::from_json(&scaled, Path::new("c.json")).unwrap_err();
        assert!(
            err.to_string().contains(
                "rope type \"dynamic\" is not supported (supported: default, linear, llama3, yarn)"
            ),
            "{err}"
        );
    }
}
