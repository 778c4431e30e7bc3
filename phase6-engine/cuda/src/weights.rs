//! The model's weights on the device, in bf16, with q/k/v and gate/up fused at load time.
//!
//! Checkpoint tensors are read as raw bytes (`phase2::Weights`); bf16 tensors go up as they
//! are, f16 and f32 ones are rounded to bf16 first. Stacking the q, k and v rows (and gate and
//! up) turns three GEMMs (two) per layer into one: the same input is read once, and the larger
//! product keeps the GPU busier.

use half::{bf16, f16};
use kernels::{CudaSlice, Gpu};
use phase2::{Dtype, Error, ModelConfig, TensorView, Weights};

use crate::runner::device_error;

pub(crate) struct LayerWeights {
    pub input_norm: CudaSlice<bf16>,
    /// `[(heads + 2 kv_heads) * head_dim, hidden]`: q rows, then k, then v.
    pub qkv: CudaSlice<bf16>,
    pub qkv_bias: Option<CudaSlice<bf16>>,
    pub q_norm: Option<CudaSlice<bf16>>,
    pub k_norm: Option<CudaSlice<bf16>>,
    pub o_proj: CudaSlice<bf16>,
    pub post_norm: CudaSlice<bf16>,
    /// `[2 * intermediate, hidden]`: gate rows, then up.
    pub gate_up: CudaSlice<bf16>,
    pub down: CudaSlice<bf16>,
}

pub(crate) struct DeviceWeights {
    pub embed: CudaSlice<bf16>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: CudaSlice<bf16>,
    /// `None` when tied to the embedding.
    pub lm_head: Option<CudaSlice<bf16>>,
    /// `f32[head_dim / 2]`: the RoPE frequency table the config computed (scaling applied).
    pub rope_inv_freq: CudaSlice<f32>,
    bytes: usize,
}

impl DeviceWeights {
    pub fn upload(gpu: &Gpu, c: &ModelConfig, w: &Weights) -> Result<Self, Error> {
        let mut loader = Loader { gpu, w, bytes: 0 };
        let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = |name: &str| format!("model.layers.{l}.{name}");
            let attn = |name: &str, rows: usize, cols: usize| (p(name), vec![rows, cols]);
            let qkv_bias = if c.qkv_bias {
                Some(loader.fused(&[
                    (p("self_attn.q_proj.bias"), vec![qd]),
                    (p("self_attn.k_proj.bias"), vec![kvd]),
                    (p("self_attn.v_proj.bias"), vec![kvd]),
                ])?)
            } else {
                None
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(loader.one(&p("self_attn.q_norm.weight"), &[d])?),
                    Some(loader.one(&p("self_attn.k_norm.weight"), &[d])?),
                )
            } else {
                (None, None)
            };
            layers.push(LayerWeights {
                input_norm: loader.one(&p("input_layernorm.weight"), &[h])?,
                qkv: loader.fused(&[
                    attn("self_attn.q_proj.weight", qd, h),
                    attn("self_attn.k_proj.weight", kvd, h),
                    attn("self_attn.v_proj.weight", kvd, h),
                ])?,
                qkv_bias,
                q_norm,
                k_norm,
                o_proj: loader.one(&p("self_attn.o_proj.weight"), &[h, qd])?,
                post_norm: loader.one(&p("post_attention_layernorm.weight"), &[h])?,
                gate_up: loader.fused(&[
                    attn("mlp.gate_proj.weight", i, h),
                    attn("mlp.up_proj.weight", i, h),
                ])?,
                down: loader.one(&p("mlp.down_proj.weight"), &[h, i])?,
            });
        }
        // As the CPU model does: a checkpoint may carry an lm_head even when tied.
        let lm_head = if c.tie_word_embeddings && !w.contains("lm_head.weight") {
            None
        } else {
            Some(loader.one("lm_head.weight", &[c.vocab_size, h])?)
        };
        Ok(Self {
            embed: loader.one("model.embed_tokens.weight", &[c.vocab_size, h])?,
            final_norm: loader.one("model.norm.weight", &[h])?,
            layers,
            lm_head,
            rope_inv_freq: gpu.upload(&c.rope.inv_freq).map_err(device_error)?,
            bytes: loader.bytes,
        })
    }

    /// The lm_head, or the embedding when they are tied.
    pub fn output(&self) -> &CudaSlice<bf16> {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

struct Loader<'a> {
    gpu: &'a Gpu,
    w: &'a Weights,
    bytes: usize,
}

impl Loader<'_> {
    fn one(&mut self, name: &str, shape: &[usize]) -> Result<CudaSlice<bf16>, Error> {
        self.fused(&[(name.to_string(), shape.to_vec())])
    }

    /// The named tensors, each checked against its shape, stacked row-wise and uploaded.
    fn fused(&mut self, parts: &[(String, Vec<usize>)]) -> Result<CudaSlice<bf16>, Error> {
        let mut host = Vec::new();
        for (name, shape) in parts {
            let t = self.w.tensor(name)?;
            if t.shape != shape.as_slice() {
                return Err(Error::model_load(
                    name,
                    format!("tensor has shape {:?}, expected {shape:?}", t.shape),
                ));
            }
            append_bf16(&t, &mut host);
        }
        self.bytes += 2 * host.len();
        self.gpu.upload(&host).map_err(device_error)
    }
}

/// Appends a tensor's values as bf16 (exact for bf16, rounded to nearest for f16 and f32).
fn append_bf16(t: &TensorView<'_>, out: &mut Vec<bf16>) {
    match t.dtype {
        Dtype::BF16 => out.extend(
            t.data
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]])),
        ),
        Dtype::F16 => out.extend(
            t.data
                .chunks_exact(2)
                .map(|b| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32())),
        ),
        Dtype::F32 => out.extend(
            t.data
                .chunks_exact(4)
                .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        ),
    }
}
