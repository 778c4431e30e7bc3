//! The engine's configuration, with the reference defaults users know from nano-vllm / vLLM.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The first CUDA device if this build has CUDA and one is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    Error::InvalidConfig(format!(
                        "device {s:?}: expected auto, cpu, cuda or cuda:N"
                    ))
                }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The number type of the stored K/V (vLLM's `kv_cache_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The runner's own: f32 on the CPU, bf16 on a GPU.
    #[default]
    Auto,
    /// One byte an element: 8-bit floats (E4M3) with a K and a V scale per layer, chapter 6.6.
    Fp8E4m3,
}

impl FromStr for KvCacheDtype {
    type Err = Error;

    /// vLLM's names: `auto`, and `fp8` or `fp8_e4m3` for E4M3.
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(KvCacheDtype::Auto),
            "fp8" | "fp8_e4m3" => Ok(KvCacheDtype::Fp8E4m3),
            _ => Err(Error::InvalidConfig(format!(
                "kv_cache_dtype {s:?}: expected auto, fp8 or fp8_e4m3"
            ))),
        }
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvCacheDtype::Auto => "auto",
            KvCacheDtype::Fp8E4m3 => "fp8_e4m3",
        })
    }
}

/// Engine settings. `Config::default()` is the reference configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Most tokens computed in one step (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Longest prompt + output; clamped to the model's `max_position_embeddings`.
    pub max_model_len: usize,
    /// Fraction of GPU memory the engine may take (weights, activations, KV).
    pub gpu_memory_utilization: f32,
    /// Only 1 is supported: nano-serving runs one GPU per engine.
    pub tensor_parallel_size: usize,
    /// Run decode without CUDA graphs (for debugging).
    pub enforce_eager: bool,
    /// Decide each decode step while the one before it runs on the device (SGLang's overlap
    /// scheduler); only runners that queue work (CUDA) use it. Off: one step at a time.
    pub overlap_scheduling: bool,
    /// Tokens per KV page; a multiple of 16.
    pub kvcache_block_size: usize,
    /// KV pages to allocate; -1 sizes them from memory.
    pub num_kvcache_blocks: i64,
    pub device: Device,
    /// KV memory on the CPU when `num_kvcache_blocks` is -1.
    pub cpu_kv_cache_bytes: usize,
    /// How K/V is stored: `Auto`, or FP8 (the CPU reference runner of chapter 6.6).
    pub kv_cache_dtype: KvCacheDtype,
    /// Most prompt tokens a request gets per step; `None` prefills prompts whole.
    pub chunked_prefill_size: Option<usize>,
    /// Reuse the K/V of earlier requests' prefixes (radix cache).
    pub enable_prefix_caching: bool,
    /// Seed for requests that bring none; `None` draws one at start.
    pub seed: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
            max_model_len: 4096,
            gpu_memory_utilization: 0.9,
            tensor_parallel_size: 1,
            enforce_eager: false,
            overlap_scheduling: true,
            kvcache_block_size: 256,
            num_kvcache_blocks: -1,
            device: Device::Auto,
            cpu_kv_cache_bytes: 1 << 30,
            kv_cache_dtype: KvCacheDtype::Auto,
            chunked_prefill_size: Some(2048),
            enable_prefix_caching: true,
            seed: None,
        }
    }
}

impl Config {
    /// Refuses settings that cannot work, with the field and the reason.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |s: String| Err(Error::InvalidConfig(s));
        if self.kvcache_block_size == 0 || !self.kvcache_block_size.is_multiple_of(16) {
            return bad(format!(
                "kvcache_block_size = {}: must be a positive multiple of 16",
                self.kvcache_block_size
            ));
        }
        if !(1..=8).contains(&self.tensor_parallel_size) {
            return bad(format!(
                "tensor_parallel_size = {}: must be 1 to 8",
                self.tensor_parallel_size
            ));
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return bad(format!(
                "gpu_memory_utilization = {}: must be in (0, 1]",
                self.gpu_memory_utilization
            ));
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return bad("max_num_seqs and max_num_batched_tokens must be at least 1".into());
        }
        if self.max_model_len < 2 {
            return bad(format!(
                "max_model_len = {}: must be at least 2",
                self.max_model_len
            ));
        }
        if self.num_kvcache_blocks == 0 || self.num_kvcache_blocks < -1 {
            return bad(format!(
                "num_kvcache_blocks = {}: must be -1 (from memory) or positive",
                self.num_kvcache_blocks
            ));
        }
        if self.chunked_prefill_size == Some(0) {
            return bad("chunked_prefill_size must be at least 1".into());
        }
        if self.chunked_prefill_size.is_none() && self.max_num_batched_tokens < self.max_model_len {
            return bad(format!(
                "without chunked prefill, max_num_batched_tokens ({}) must hold a whole prompt of max_model_len ({})",
                self.max_num_batched_tokens, self.max_model_len
            ));
        }
        Ok(())
    }

    /// Refuses a model this config cannot serve faithfully: one whose sliding-window attention
    /// is shorter than the contexts allowed (this engine attends to the whole context, so past
    /// the window it would silently compute something the model was not trained for).
    pub fn validate_for(&self, model: &phase2::ModelConfig) -> Result<(), Error> {
        let len = self.max_model_len.min(model.max_position_embeddings);
        match model.sliding_window {
            Some(window) if window < len => Err(Error::InvalidConfig(format!(
                "the model uses sliding-window attention over {window} tokens, shorter than \
                 max_model_len {len}: this engine attends to the whole context, so set \
                 max_model_len to at most {window}"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_reference_ones_and_valid() {
        let c = Config::default();
        assert_eq!(
            (c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len),
            (16384, 512, 4096)
        );
        assert_eq!(
            (
                c.gpu_memory_utilization,
                c.tensor_parallel_size,
                c.enforce_eager
            ),
            (0.9, 1, false)
        );
        assert_eq!(
            (c.kvcache_block_size, c.num_kvcache_blocks, c.device),
            (256, -1, Device::Auto)
        );
        c.validate().unwrap();
    }

    #[test]
    fn bad_settings_name_their_field() {
        let check = |c: Config, field: &str| {
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        };
        check(
            Config {
                kvcache_block_size: 24,
                ..Config::default()
            },
            "kvcache_block_size = 24",
        );
        check(
            Config {
                kvcache_block_size: 0,
                ..Config::default()
            },
            "kvcache_block_size",
        );
        check(
            Config {
                tensor_parallel_size: 9,
                ..Config::default()
            },
            "tensor_parallel_size = 9: must be 1 to 8",
        );
        check(
            Config {
                gpu_memory_utilization: 1.5,
                ..Config::default()
            },
            "gpu_memory_utilization",
        );
        check(
            Config {
                num_kvcache_blocks: -5,
                ..Config::default()
            },
            "num_kvcache_blocks = -5",
        );
        check(
            Config {
                max_num_seqs: 0,
                ..Config::default()
            },
            "max_num_seqs",
        );
        let no_chunk = Config {
            chunked_prefill_size: None,
            max_num_batched_tokens: 1024,
            ..Config::default()
        };
        check(no_chunk, "max_num_batched_tokens (1024)");
        Config {
            kvcache_block_size: 48,
            ..Config::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn a_sliding_window_shorter_than_the_context_is_refused() {
        let path = phase2::models_dir().join("../configs/mistral-7b-v0.1.json");
        let model = phase2::ModelConfig::from_file(&path).unwrap();
        let long = Config {
            max_model_len: 8192,
            ..Config::default()
        };
        let err = long.validate_for(&model).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config: the model uses sliding-window attention over 4096 tokens, shorter \
             than max_model_len 8192: this engine attends to the whole context, so set \
             max_model_len to at most 4096"
        );
        let fits = Config {
            max_model_len: 4096,
            ..Config::default()
        };
        fits.validate_for(&model).unwrap();
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert!("tpu".parse::<Device>().is_err());
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn kv_cache_dtypes_parse_by_vllms_names() {
        assert_eq!(Config::default().kv_cache_dtype, KvCacheDtype::Auto);
        for name in ["fp8", "fp8_e4m3"] {
            assert_eq!(name.parse::<KvCacheDtype>().unwrap(), KvCacheDtype::Fp8E4m3);
        }
        assert_eq!("auto".parse::<KvCacheDtype>().unwrap(), KvCacheDtype::Auto);
        assert_eq!(KvCacheDtype::Fp8E4m3.to_string(), "fp8_e4m3");
        let err = "fp8_e5m2".parse::<KvCacheDtype>().unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid config: kv_cache_dtype \"fp8_e5m2\": expected auto, fp8 or fp8_e4m3"
        );
    }
}
