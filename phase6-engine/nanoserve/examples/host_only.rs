//! The engine's own host time per step: `nanoserve bench`'s workload (nano-vllm's: 256
//! requests, prompts and outputs of 100..=1024 tokens) through the chapter 5 engine with a
//! runner that does no work and answers instantly. What is left is the scheduler, the page
//! pool, the radix cache and the bookkeeping of every step: the part of a GPU step's gap that
//! is not the runner's.
//!
//!     cargo run --release -p nanoserve --example host_only

use std::time::{Duration, Instant};

use nanoserve::workload::WorkloadSpec;
use phase0::TokenId;
use phase1::{KvDtype, KvLayout};
use phase2::{Error, ForwardBatch, Logits, ModelRunner};
use phase5::{Batching, Engine, SchedulerConfig};

/// The allocator `nanoserve` uses, so that this measures the same host time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Qwen3-0.6B's KV shape and vocabulary, the KV cache of an H100 run (2,482 pages of 256),
/// and no model: every sampling sequence gets token 7.
struct NullRunner;

impl ModelRunner for NullRunner {
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            num_layers: 28,
            num_kv_heads: 8,
            head_dim: 128,
            dtype: KvDtype::BF16,
        }
    }

    fn num_pages(&self) -> usize {
        2482
    }

    fn page_size(&self) -> usize {
        256
    }

    fn vocab_size(&self) -> usize {
        151_936
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        let rows = batch.seqs.iter().filter(|s| s.sample.is_some()).count();
        let mut data = vec![f32::NEG_INFINITY; rows * self.vocab_size()];
        for row in data.chunks_mut(self.vocab_size()) {
            row[7] = 0.0;
        }
        Ok(Logits {
            vocab_size: self.vocab_size(),
            data,
        })
    }

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        Ok(batch
            .seqs
            .iter()
            .filter(|s| s.sample.is_some())
            .map(|_| 7)
            .collect())
    }
}

fn main() -> Result<(), Error> {
    for prefix_cache in [false, true] {
        let config = SchedulerConfig {
            max_num_batched_tokens: 16384,
            max_num_seqs: 512,
            chunk_size: Some(2048),
            enable_prefix_caching: prefix_cache,
            batching: Batching::Continuous,
            max_model_len: 4096,
        };
        let mut engine = Engine::new(NullRunner, config, Vec::new(), 0)?;
        for item in WorkloadSpec::default().build(NullRunner.vocab_size()) {
            engine.add_request(item.prompt, item.params)?;
        }
        let (mut steps, mut decode_steps, mut decode_time) = (0, 0, Duration::ZERO);
        let start = Instant::now();
        while !engine.is_finished() {
            let t = Instant::now();
            let step = engine.step()?;
            steps += 1;
            if step.num_prefill_tokens == 0 {
                decode_steps += 1;
                decode_time += t.elapsed();
            }
        }
        println!(
            "prefix cache {}: {steps} steps in {:.1} ms; {decode_steps} decode steps, {:.1} us each on average",
            if prefix_cache { "on" } else { "off" },
            start.elapsed().as_secs_f64() * 1e3,
            decode_time.as_secs_f64() * 1e6 / decode_steps.max(1) as f64,
        );
    }
    Ok(())
}
