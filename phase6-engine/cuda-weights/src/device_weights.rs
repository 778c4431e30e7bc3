//! Chapter 6.4: the model's weights on the device, in bf16, with q/k/v and gate/up fused at
//! load time.
//!
//! Checkpoint tensors are read from the files (`phase2::Weights`, or any [`TensorSource`])
//! and go to the device through a ring of pinned buffers: while the copy engine moves one
//! buffer, every core fills the next one from the files (bf16 copied as it is, f16 and f32
//! rounded to bf16 on the way), so reading the disk or page cache and crossing PCIe overlap,
//! and no tensor is ever held whole in host memory. Random weights never touch the host: they
//! are generated in place by the same counter-based recipe as on the CPU. Stacking the q, k
//! and v rows (and gate and up) turns three GEMMs (two) per layer into one: the same input is
//! read once, and the larger product keeps the GPU busier.

use std::time::Instant;

use half::bf16;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kernels::{CudaEvent, CudaSlice, Gpu, PinnedHostSlice};
use phase2::{Error, ModelConfig};

use crate::errors::{device_error, driver_error};
use crate::source::TensorSource;

/// One decoder layer's tensors.
pub struct LayerWeights {
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

/// Every tensor of the model (or of a rank's part of it) on one device.
pub struct DeviceWeights {
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
    /// Loads every tensor of `w` onto the device, showing progress on a terminal and printing
    /// one summary line (size, time, GiB/s) on stderr. `c` gives the shapes the tensors must
    /// have: the model's, or a rank's narrower ones (its heads, its slice of the vocabulary).
    pub fn upload(gpu: &Gpu, c: &ModelConfig, w: &dyn TensorSource) -> Result<Self, Error> {
        let mut loader = Loader::new(gpu, w)?;
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
        let embed = loader.one("model.embed_tokens.weight", &[c.vocab_size, h])?;
        let final_norm = loader.one("model.norm.weight", &[h])?;
        let bytes = loader.finish()?;
        Ok(Self {
            embed,
            final_norm,
            layers,
            lm_head,
            rope_inv_freq: gpu.upload(&c.rope.inv_freq).map_err(device_error)?,
            bytes,
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

/// Elements of one pinned staging buffer (64 MiB of bf16), and how many buffers circulate.
const STAGE: usize = 32 << 20;
const RING: usize = 3;

/// A pinned buffer and the event that says the device has finished reading it.
struct Stage {
    host: PinnedHostSlice<bf16>,
    done: CudaEvent,
    in_flight: bool,
}

struct Loader<'a> {
    gpu: &'a Gpu,
    w: &'a dyn TensorSource,
    /// Pinned buffers; none for random weights, which are made on the device.
    ring: Vec<Stage>,
    next: usize,
    bytes: usize,
    bar: ProgressBar,
    start: Instant,
}

impl<'a> Loader<'a> {
    fn new(gpu: &'a Gpu, w: &'a dyn TensorSource) -> Result<Self, Error> {
        let ring = if w.random_seed().is_some() {
            Vec::new()
        } else {
            let stage = STAGE.min(w.total_bytes() / 2 + 1);
            (0..RING)
                .map(|_| {
                    Ok(Stage {
                        host: gpu.pinned(stage)?,
                        done: gpu.event()?,
                        in_flight: false,
                    })
                })
                .collect::<kernels::Result<_>>()
                .map_err(device_error)?
        };
        let bar = ProgressBar::with_draw_target(
            Some(w.total_bytes() as u64),
            ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            ProgressStyle::with_template(
                "weights {bar:30} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} [{elapsed_precise}]",
            )
            .expect("valid template"),
        );
        Ok(Self {
            gpu,
            w,
            ring,
            next: 0,
            bytes: 0,
            bar,
            start: Instant::now(),
        })
    }

    fn one(&mut self, name: &str, shape: &[usize]) -> Result<CudaSlice<bf16>, Error> {
        self.fused(&[(name.to_string(), shape.to_vec())])
    }

    /// The named tensors, each checked against its shape, stacked row-wise on the device.
    fn fused(&mut self, parts: &[(String, Vec<usize>)]) -> Result<CudaSlice<bf16>, Error> {
        for (name, shape) in parts {
            let found = self.w.shape(name)?;
            if found != *shape {
                return Err(Error::model_load(
                    name,
                    format!("tensor has shape {found:?}, expected {shape:?}"),
                ));
            }
        }
        let total: usize = parts.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
        let mut out = self.gpu.zeros::<bf16>(total).map_err(device_error)?;
        let mut offset = 0;
        for (name, shape) in parts {
            let n: usize = shape.iter().product();
            match self.w.random_draw(name)? {
                Some(draw) if draw.len > n => {
                    return Err(Error::model_load(
                        name,
                        format!("{} random elements drawn into {n}", draw.len),
                    ));
                }
                Some(draw) => {
                    let mut view = out.slice_mut(offset..offset + draw.len);
                    kernels::random::fill_uniform(
                        self.gpu,
                        &mut view,
                        draw.key,
                        draw.dist.mean,
                        draw.dist.half_width,
                        draw.window,
                    )
                    .map_err(device_error)?;
                    self.bar.inc(2 * n as u64);
                }
                None => {
                    self.copy(name, &mut out, offset)?;
                }
            }
            offset += n;
        }
        self.bytes += 2 * total;
        Ok(out)
    }

    /// Queues tensor `name` into `out` from `offset` on, one pinned buffer at a time.
    fn copy(&mut self, name: &str, out: &mut CudaSlice<bf16>, offset: usize) -> Result<(), Error> {
        let dtype = self.w.dtype(name)?;
        let n = self.w.shape(name)?.iter().product::<usize>();
        let mut start = 0;
        while start < n {
            let len = STAGE.min(n - start);
            let slot = self.next;
            self.next = (slot + 1) % self.ring.len();
            let stage = &mut self.ring[slot];
            if stage.in_flight {
                stage
                    .done
                    .synchronize()
                    .map_err(|e| driver_error("waiting for a staging copy", e))?;
            }
            let host = stage
                .host
                .as_mut_slice()
                .map_err(|e| driver_error("reading pinned host memory", e))?;
            self.w.read_bf16(name, start, &mut host[..len])?;
            let mut view = out.slice_mut(offset + start..offset + start + len);
            self.gpu
                .copy_to_device(&host[..len], &mut view)
                .map_err(device_error)?;
            self.gpu.record(&stage.done).map_err(device_error)?;
            stage.in_flight = true;
            self.bar.inc((len * dtype.size_bytes()) as u64);
            start += len;
        }
        Ok(())
    }

    /// Waits for the last copies and prints the summary line; returns the device bytes.
    fn finish(self) -> Result<usize, Error> {
        self.gpu.synchronize().map_err(device_error)?;
        self.bar.finish_and_clear();
        let secs = self.start.elapsed().as_secs_f64();
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        let how = match self.w.random_seed() {
            Some(seed) => format!("generated on the device (random, seed {seed})"),
            None => "loaded".to_string(),
        };
        eprintln!(
            "weights: {gib:.2} GiB {how} in {secs:.2} s ({:.1} GiB/s)",
            gib / secs.max(1e-9)
        );
        Ok(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random weights made on the device are bit for bit the ones the host makes from the same
    /// seed (the same model on either runner), and a checkpoint goes up unchanged through the
    /// pinned ring.
    #[test]
    fn device_weights_equal_the_host_ones() {
        let gpu = match Gpu::open(0) {
            Ok(gpu) => gpu,
            Err(kernels::Error::NoDevice(reason)) => {
                use std::io::Write;
                let line = format!("device_weights_equal_the_host_ones: skipped: {reason}\n");
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
                return;
            }
            Err(other) => panic!("a GPU is present but cannot be used: {other}"),
        };
        let dir = phase2::models_dir().join("fixtures/qwen25-yarn");
        let c = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let checkpoint = phase2::Weights::open(&dir).unwrap();
        for w in [phase2::Weights::random(&c, 3), checkpoint] {
            let d = DeviceWeights::upload(&gpu, &c, &w).unwrap();
            let host = |name: &str| {
                let t = w.tensor(name).unwrap();
                let mut v = Vec::new();
                v.extend(
                    t.data
                        .chunks_exact(2)
                        .map(|b| bf16::from_le_bytes([b[0], b[1]])),
                );
                v
            };
            let mut qkv = host("model.layers.1.self_attn.q_proj.weight");
            qkv.extend(host("model.layers.1.self_attn.k_proj.weight"));
            qkv.extend(host("model.layers.1.self_attn.v_proj.weight"));
            assert_eq!(gpu.download(&d.layers[1].qkv).unwrap(), qkv);
            let bias = gpu
                .download(d.layers[0].qkv_bias.as_ref().unwrap())
                .unwrap();
            assert_eq!(
                bias[..128],
                host("model.layers.0.self_attn.q_proj.bias")[..]
            );
            let norm = gpu.download(&d.final_norm).unwrap();
            assert_eq!(norm, host("model.norm.weight"));
            let lm_head = gpu.download(d.lm_head.as_ref().unwrap()).unwrap();
            assert_eq!(lm_head, host("lm_head.weight"));
        }
    }
}
