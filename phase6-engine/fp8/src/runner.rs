//! Chapter 6.6: the FP8 CPU runner: chapter 2's CPU runner with its K/V kept as FP8 E4M3.
//!
//! Each step runs chapter 2's forward pass with [`Fp8Attention`], then rounds the K/V the
//! step wrote, in place, so that the store holds only values an FP8 cache can hold (its codes
//! decoded and scaled back, kept as `f32`). Everything that later reads or moves K/V sees what
//! a GPU's byte cache would give it: a copy with a RoPE shift (`copy_kv`) turns the rounded
//! keys and rounds the result again, as a kernel that dequantizes, rotates and quantizes does.

use std::sync::OnceLock;

use phase1::{BlockTable, KvDtype, KvLayout};
use phase2::{CpuRunner, Error, ForwardBatch, Logits, Model, ModelConfig, ModelRunner, Weights};
use phase6::{Config, Device, Runner, cpu_kv_pages, load_cpu_model};
use phase6_chunks::{CascadeStats, ChunkRunner, copy_kv_rotated};

use crate::attention::{Fp8Attention, new_slots, round_slot};
use crate::scales::KvScales;

/// The CPU runner with an FP8 (E4M3) K/V cache and per-layer scales.
pub struct Fp8CpuRunner {
    inner: CpuRunner,
    /// Per layer, set once: at start (1.0) or by the first step (`calculate_kv_scales`).
    scales: Vec<OnceLock<KvScales>>,
}

impl Fp8CpuRunner {
    /// A runner with K/V storage for `num_pages` pages of `page_size` tokens. With
    /// `calculate_kv_scales` (vLLM's name) each layer's scales come from the first step that
    /// runs (`amax / 448`); without, they are 1.0.
    pub fn new(
        model: Model,
        num_pages: usize,
        page_size: usize,
        calculate_kv_scales: bool,
    ) -> Self {
        let scales = (0..model.config.num_layers)
            .map(|_| {
                let scale = OnceLock::new();
                if !calculate_kv_scales {
                    scale.get_or_init(KvScales::default);
                }
                scale
            })
            .collect();
        Self {
            inner: CpuRunner::new(model, num_pages, page_size),
            scales,
        }
    }

    /// Each layer's scales; `None` for a layer still waiting for its first step.
    pub fn kv_scales(&self) -> Vec<Option<KvScales>> {
        self.scales.iter().map(|s| s.get().copied()).collect()
    }

    /// The K/V of one token per element, as an FP8 cache of this model stores it.
    pub fn fp8_layout(config: &ModelConfig) -> KvLayout {
        KvLayout {
            num_layers: config.num_layers,
            num_kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            dtype: KvDtype::Fp8E4m3,
        }
    }

    /// Rounds the K/V of `slots` in every layer through FP8, in place.
    fn round_slots(&mut self, slots: &[(u32, usize)]) {
        let c = &self.inner.model().config;
        let (layers, d) = (c.num_layers, c.head_dim);
        for layer in 0..layers {
            let scales = *self.scales[layer]
                .get()
                .expect("every layer's attention has run, which sets its scales");
            let store = self.inner.store_mut();
            for &slot in slots {
                round_slot(store, layer, d, slot, scales);
            }
        }
    }
}

impl ModelRunner for Fp8CpuRunner {
    /// What this runner holds: FP8 values kept as `f32` (the memory the CPU spends).
    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }

    fn num_pages(&self) -> usize {
        self.inner.num_pages()
    }

    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        let attention = Fp8Attention {
            scales: &self.scales,
        };
        let logits = self.inner.forward_with(batch, &attention)?;
        self.round_slots(&new_slots(batch, self.inner.page_size()));
        Ok(logits)
    }
}

impl ChunkRunner for Fp8CpuRunner {
    /// Turns the stored (rounded) keys and stores the result rounded again.
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        copy_kv_rotated(&mut self.inner, src, dst, rope_shift)?;
        if self.scales.iter().any(|s| s.get().is_none()) {
            return Err(Error::InvalidBatch(
                "copy_kv before the first step has set the FP8 scales".into(),
            ));
        }
        let ps = self.inner.page_size();
        let slots: Vec<(u32, usize)> = (0..dst.num_tokens())
            .map(|i| {
                let slot = dst.slot(i, ps);
                (slot.page, slot.offset)
            })
            .collect();
        self.round_slots(&slots);
        Ok(())
    }

    /// Sequences attend page by page (no cascade), so nothing is planned.
    fn cascade_stats(&self) -> CascadeStats {
        CascadeStats::default()
    }
}

/// The FP8 CPU runner the config asks for (`kv_cache_dtype = fp8`), its pages sized like the
/// f32 CPU runner's: on the CPU the FP8 values are kept as `f32`, so the budget holds the same
/// tokens; the report line gives both costs per token.
pub fn fp8_cpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<dyn ChunkRunner>, phase6::Error> {
    let fp8 = Fp8CpuRunner::fp8_layout(&model_config);
    let model = load_cpu_model(model_config, weights)?;
    let layout = CpuRunner::kv_layout_of(&model);
    let pages = cpu_kv_pages(&layout, config)?;
    let ps = config.kvcache_block_size;
    let kib = |bytes: usize| bytes as f64 / 1024.0;
    let report = format!(
        "device cpu: KV cache fp8_e4m3 (scales 1.0) of {pages} pages x {ps} tokens = {} tokens, \
         {:.1} KiB a token as FP8, kept as f32 on the CPU ({:.1} KiB a token, {:.1} MiB)",
        pages * ps,
        kib(fp8.bytes_per_token()),
        kib(layout.bytes_per_token()),
        (pages * layout.page_bytes(ps)) as f64 / (1 << 20) as f64
    );
    Ok(Runner {
        runner: Box::new(Fp8CpuRunner::new(model, pages, ps, false)),
        device: Device::Cpu,
        report,
    })
}
