//! Chapter 6.5: a rank's tensors, sliced out of the checkpoint as the GPU loader reads them.
//!
//! The loader of chapter 6.4 reads any [`TensorSource`]; this one answers every read with the
//! rank's part of the tensor (the split of [`crate::shard`]): a range of rows (q/k/v, gate/up,
//! the vocabulary of the embedding and lm_head) is one contiguous read of the file, a range of
//! columns (o_proj, down) one read per row. Nothing is re-exported: every rank reads its slices
//! from the same safetensors files. Random weights are drawn at their place in the whole tensor
//! (on the device, as a window onto the whole tensor's stream), so a rank holds exactly the
//! slice of the single-GPU model.

use std::ops::Range;

use half::bf16;
use kernels::random::Window;
use phase2::{Dtype, Error, ModelConfig, Weights};
use phase6_cuda_weights::{RandomDraw, TensorSource};

use crate::shard::Shard;

/// How a rank's tensor is cut from the whole one.
#[derive(Debug, Clone, PartialEq)]
enum Cut {
    Whole,
    /// Rows `rows` of a matrix (or vector) whose rows are `width` elements, followed by zero
    /// rows up to `padded` rows (the last rank's slice of the vocabulary).
    Rows {
        rows: Range<usize>,
        width: usize,
        padded: usize,
    },
    /// Columns `cols` of every row of a matrix `width` wide.
    Columns {
        cols: Range<usize>,
        width: usize,
    },
}

/// Rank `shard`'s view of `weights`.
pub struct ShardSource<'w> {
    weights: &'w Weights,
    config: ModelConfig,
    shard: Shard,
}

impl<'w> ShardSource<'w> {
    pub fn new(weights: &'w Weights, config: &ModelConfig, shard: Shard) -> Self {
        Self {
            weights,
            config: config.clone(),
            shard,
        }
    }

    /// Rows of every rank's slice of the vocabulary (the last one padded to it), so that all
    /// ranks' logits have the same width, as an all-gather needs.
    pub fn vocab_rows(c: &ModelConfig, tp: usize) -> usize {
        c.vocab_size.div_ceil(tp)
    }

    fn cut(&self, name: &str) -> Result<Cut, Error> {
        let c = &self.config;
        let (h, d) = (c.hidden_size, c.head_dim);
        let shape = self.weights.shape(name)?;
        let width = if shape.len() == 2 { shape[1] } else { 1 };
        let rows = |r: Range<usize>| Cut::Rows {
            padded: r.len(),
            rows: r,
            width,
        };
        let (q, kv, inter) = (
            self.shard.q_heads(c),
            self.shard.kv_heads(c),
            self.shard.intermediate(c),
        );
        let heads = |r: Range<usize>| r.start * d..r.end * d;
        let Some(part) = name.strip_prefix("model.layers.") else {
            return Ok(match name {
                "model.embed_tokens.weight" | "lm_head.weight" => Cut::Rows {
                    rows: self.shard.vocab(c),
                    width: h,
                    padded: Self::vocab_rows(c, self.shard.world_size),
                },
                _ => Cut::Whole,
            });
        };
        let part = part.split_once('.').map_or("", |(_, p)| p);
        Ok(match part {
            "self_attn.q_proj.weight" | "self_attn.q_proj.bias" => rows(heads(q)),
            "self_attn.k_proj.weight"
            | "self_attn.k_proj.bias"
            | "self_attn.v_proj.weight"
            | "self_attn.v_proj.bias" => rows(heads(kv)),
            "self_attn.o_proj.weight" => Cut::Columns {
                cols: heads(q),
                width,
            },
            "mlp.gate_proj.weight" | "mlp.up_proj.weight" => rows(inter),
            "mlp.down_proj.weight" => Cut::Columns { cols: inter, width },
            _ => Cut::Whole,
        })
    }
}

impl TensorSource for ShardSource<'_> {
    fn shape(&self, name: &str) -> Result<Vec<usize>, Error> {
        let mut shape = self.weights.shape(name)?.to_vec();
        match self.cut(name)? {
            Cut::Whole => {}
            Cut::Rows { padded, .. } => shape[0] = padded,
            Cut::Columns { cols, .. } => shape[1] = cols.len(),
        }
        Ok(shape)
    }

    fn dtype(&self, name: &str) -> Result<Dtype, Error> {
        self.weights.tensor_dtype(name)
    }

    fn contains(&self, name: &str) -> bool {
        self.weights.contains(name)
    }

    fn read_bf16(&self, name: &str, start: usize, out: &mut [bf16]) -> Result<(), Error> {
        match self.cut(name)? {
            Cut::Whole => self.weights.read_bf16(name, start, out),
            Cut::Rows { rows, width, .. } => {
                // Elements past the rank's real rows are the padding: zeros.
                let real = (rows.len() * width).saturating_sub(start).min(out.len());
                let (data, pad) = out.split_at_mut(real);
                pad.fill(bf16::ZERO);
                self.weights
                    .read_bf16(name, rows.start * width + start, data)
            }
            Cut::Columns { cols, width } => {
                let n = cols.len();
                let mut done = 0;
                while done < out.len() {
                    let (row, col) = ((start + done) / n, (start + done) % n);
                    let run = (n - col).min(out.len() - done);
                    let at = row * width + cols.start + col;
                    self.weights
                        .read_bf16(name, at, &mut out[done..done + run])?;
                    done += run;
                }
                Ok(())
            }
        }
    }

    fn random_seed(&self) -> Option<u64> {
        self.weights.random_seed()
    }

    /// The rank's rows or columns as a window onto the whole tensor's stream, so the device
    /// draws exactly the slice the host would cut.
    fn random_draw(&self, name: &str) -> Result<Option<RandomDraw>, Error> {
        let Some(whole) = self.weights.random_draw(name)? else {
            return Ok(None);
        };
        let (window, len) = match self.cut(name)? {
            Cut::Whole => (whole.window, whole.len),
            Cut::Rows { rows, width, .. } => {
                let len = rows.len() * width;
                let first = (rows.start * width) as u64;
                let window = Window {
                    first,
                    ..Window::whole(len as u64)
                };
                (window, len)
            }
            Cut::Columns { cols, width } => {
                let window = Window {
                    first: cols.start as u64,
                    width: cols.len() as u64,
                    stride: width as u64,
                };
                (window, whole.len / width * cols.len())
            }
        };
        Ok(Some(RandomDraw {
            window,
            len,
            ..whole
        }))
    }

    fn total_bytes(&self) -> usize {
        self.weights
            .names()
            .map(|name| {
                let n: usize = self.shape(name).map_or(0, |s| s.iter().product());
                n * self.weights.tensor_dtype(name).map_or(2, Dtype::size_bytes)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank's tensors read through the view are the slices `Shard::slice` cuts on the CPU: a
    /// fixture at 2 ranks, and a model whose 2 KV heads are copied over 4 ranks and whose
    /// vocabulary (2,001) leaves the last slice padded.
    #[test]
    fn slices_match_the_cpu_split() {
        let dir = phase2::models_dir().join("fixtures/qwen25-yarn");
        let fixture = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        for (c, tp) in [(fixture, 2), (odd(), 4)] {
            check_ranks(&c, tp);
        }
    }

    /// 2 KV heads (copied over 4 ranks) and a vocabulary of 2,001 (the last slice padded).
    fn odd() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"architectures":["Qwen2ForCausalLM"],"vocab_size":2001,"hidden_size":64,
            "intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,
            "num_key_value_heads":2,"rms_norm_eps":1e-6,"rope_theta":10000,
            "max_position_embeddings":64,"tie_word_embeddings":true}"#,
            std::path::Path::new("config.json"),
        )
        .unwrap()
    }

    /// On a GPU, random weights are drawn in place: each rank's tensors, uploaded by chapter
    /// 6.4's loader, are the slices the host reads (rows, columns, padded vocabulary).
    #[test]
    fn slices_drawn_on_the_device_match_the_host_reads() {
        let gpu = match kernels::Gpu::open(0) {
            Ok(gpu) => gpu,
            Err(kernels::Error::NoDevice(reason)) => {
                use std::io::Write;
                let line =
                    format!("slices_drawn_on_the_device_match_the_host_reads: skipped: {reason}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
                return;
            }
            Err(other) => panic!("a GPU is present but cannot be used: {other}"),
        };
        let dir = phase2::models_dir().join("fixtures/qwen3-hd32-kv1-untied");
        let untied = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        for (c, tp) in [(untied, 2), (odd(), 4)] {
            let weights = Weights::random(&c, 7);
            for rank in 0..tp {
                let shard = Shard {
                    rank,
                    world_size: tp,
                };
                let view = ShardSource::new(&weights, &c, shard);
                let narrow = ModelConfig {
                    vocab_size: ShardSource::vocab_rows(&c, tp),
                    ..shard.config(&c)
                };
                let d = phase6_cuda_weights::DeviceWeights::upload(&gpu, &narrow, &view).unwrap();
                let host = |names: &[&str]| -> Vec<bf16> {
                    let mut all = Vec::new();
                    for name in names {
                        let n: usize = view.shape(name).unwrap().iter().product();
                        let mut out = vec![bf16::ZERO; n];
                        view.read_bf16(name, 0, &mut out).unwrap();
                        all.extend(out);
                    }
                    all
                };
                let down = |x: &kernels::CudaSlice<bf16>| gpu.download(x).unwrap();
                let p = |s: &str| format!("model.layers.1.{s}");
                let l = &d.layers[1];
                let qkv =
                    ["q_proj", "k_proj", "v_proj"].map(|x| p(&format!("self_attn.{x}.weight")));
                assert_eq!(
                    down(&l.qkv),
                    host(&qkv.each_ref().map(String::as_str)),
                    "rank {rank} of {tp}: qkv"
                );
                assert_eq!(
                    down(&l.o_proj),
                    host(&[&p("self_attn.o_proj.weight")]),
                    "o_proj"
                );
                assert_eq!(down(&l.down), host(&[&p("mlp.down_proj.weight")]), "down");
                let gate_up = [p("mlp.gate_proj.weight"), p("mlp.up_proj.weight")];
                let gate_up = host(&gate_up.each_ref().map(String::as_str));
                assert_eq!(down(&l.gate_up), gate_up, "gate_up");
                if let Some(bias) = &l.qkv_bias {
                    let names =
                        ["q_proj", "k_proj", "v_proj"].map(|x| p(&format!("self_attn.{x}.bias")));
                    let names = names.each_ref().map(String::as_str);
                    assert_eq!(down(bias), host(&names), "qkv bias");
                }
                assert_eq!(
                    down(&d.embed),
                    host(&["model.embed_tokens.weight"]),
                    "embedding"
                );
                if let Some(head) = &d.lm_head {
                    assert_eq!(down(head), host(&["lm_head.weight"]), "lm_head");
                }
            }
        }
    }

    fn check_ranks(c: &ModelConfig, tp: usize) {
        let weights = Weights::random(c, 5);
        let model = phase2::Model::from_weights(c.clone(), &weights).unwrap();
        for rank in 0..tp {
            let shard = Shard {
                rank,
                world_size: tp,
            };
            let part = shard.slice(&model);
            let view = ShardSource::new(&weights, c, shard);
            let read = |name: &str| -> Vec<f32> {
                let n: usize = view.shape(name).unwrap().iter().product();
                let mut out = vec![bf16::ZERO; n];
                view.read_bf16(name, 0, &mut out).unwrap();
                out.iter().map(|x| x.to_f32()).collect()
            };
            let l = &part.layers[1];
            let p = |s: &str| format!("model.layers.1.{s}");
            let mut qkv = read(&p("self_attn.q_proj.weight"));
            qkv.extend(read(&p("self_attn.k_proj.weight")));
            qkv.extend(read(&p("self_attn.v_proj.weight")));
            assert_eq!(qkv, l.qkv, "rank {rank} of {tp}");
            assert_eq!(read(&p("self_attn.o_proj.weight")), l.o_proj);
            assert_eq!(read(&p("mlp.down_proj.weight")), l.down);
            let embed = read("model.embed_tokens.weight");
            let each = ShardSource::vocab_rows(c, tp);
            assert_eq!(embed.len(), each * c.hidden_size);
            assert_eq!(embed[..part.embed.len()], part.embed[..]);
            assert!(embed[part.embed.len()..].iter().all(|&x| x == 0.0));
        }
    }
}
