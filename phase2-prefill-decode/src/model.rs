//! A loaded decoder: its config and its weights in the f32 form the CPU forward pass uses.
//!
//! The q, k and v projections are concatenated into one matrix, and so are the MLP's gate and
//! up projections: one matrix product each instead of three and two.

use std::path::Path;

use crate::config::ModelConfig;
use crate::error::Error;
use crate::weights::Weights;

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer {
    pub input_norm: Vec<f32>,
    /// `[(heads + 2 * kv_heads) * head_dim, hidden]`: q rows, then k rows, then v rows.
    pub qkv: Vec<f32>,
    pub qkv_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// `[hidden, heads * head_dim]`.
    pub o_proj: Vec<f32>,
    pub post_norm: Vec<f32>,
    /// `[2 * intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub down: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<Vec<f32>>,
}

impl Model {
    /// Loads `config.json` and the safetensors weights of a model folder.
    pub fn load(dir: &Path) -> Result<Self, Error> {
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::open(dir)?;
        Self::from_weights(config, &weights)
    }

    /// Builds the model from named tensors, checking every shape.
    pub fn from_weights(config: ModelConfig, w: &Weights) -> Result<Self, Error> {
        let c = &config;
        let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}");
            let get = |name: &str, shape: &[usize]| w.get_f32(&format!("{p}.{name}"), shape);
            let mut qkv = get("self_attn.q_proj.weight", &[qd, h])?;
            qkv.extend(get("self_attn.k_proj.weight", &[kvd, h])?);
            qkv.extend(get("self_attn.v_proj.weight", &[kvd, h])?);
            let qkv_bias = if c.qkv_bias {
                let mut b = get("self_attn.q_proj.bias", &[qd])?;
                b.extend(get("self_attn.k_proj.bias", &[kvd])?);
                b.extend(get("self_attn.v_proj.bias", &[kvd])?);
                Some(b)
            } else {
                None
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(get("self_attn.q_norm.weight", &[d])?),
                    Some(get("self_attn.k_norm.weight", &[d])?),
                )
            } else {
                (None, None)
            };
            let mut gate_up = get("mlp.gate_proj.weight", &[i, h])?;
            gate_up.extend(get("mlp.up_proj.weight", &[i, h])?);
            layers.push(Layer {
                input_norm: get("input_layernorm.weight", &[h])?,
                qkv,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: get("self_attn.o_proj.weight", &[h, qd])?,
                post_norm: get("post_attention_layernorm.weight", &[h])?,
                gate_up,
                down: get("mlp.down_proj.weight", &[h, i])?,
            });
        }
        let lm_head = if c.tie_word_embeddings && !w.contains("lm_head.weight") {
            None
        } else {
            Some(w.get_f32("lm_head.weight", &[c.vocab_size, h])?)
        };
        Ok(Self {
            embed: w.get_f32("model.embed_tokens.weight", &[c.vocab_size, h])?,
            final_norm: w.get_f32("model.norm.weight", &[h])?,
            layers,
            lm_head,
            config,
        })
    }

    /// The output projection: the lm_head, or the embedding when they are tied.
    pub fn output_matrix(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }
}
