//! Chapter 6.5: the tensor-parallel CPU runner: one thread per rank, every rank runs the same
//! step on its part of the model.
//!
//! The scheduler runs once and hands the step to all ranks. Each rank embeds the tokens of its
//! vocabulary slice (zeros elsewhere) and all-reduces, so every rank holds the whole hidden
//! state; then, per layer, it runs chapter 2's attention and MLP blocks on its heads and its
//! intermediate slice, all-reducing each block's output before the residual add. Each rank's
//! K/V store holds only its KV heads, so the same memory holds `tp` times the tokens. The
//! lm_head gives each rank the logits of its vocabulary slice; they are gathered, because
//! sampling (top-k, top-p) needs the whole distribution.

use std::ops::Range;
use std::sync::Arc;

use phase1::{BlockTable, KvLayout};
use phase2::ops::{matmul, rms_norm};
use phase2::{
    BatchLimits, CpuRunner, Error, ForwardBatch, Logits, ModelConfig, ModelRunner, PagedAttention,
    Weights, batch_rows, sampled_rows, validate_batch,
};
use phase6::{Config, Device, Runner, cpu_kv_pages, load_cpu_model};
use phase6_chunks::{CascadeStats, ChunkRunner, copy_kv_rotated};

use crate::collective::{Collective, ThreadGroup};
use crate::shard::{Shard, check_split};

/// One rank: its part of the model with its own K/V store, and its link to the others.
struct Rank {
    runner: CpuRunner,
    /// Every rank's vocabulary slice (`Shard::vocab`), in rank order; this rank's is at
    /// `group.rank()`.
    vocabs: Arc<[Range<usize>]>,
    group: Box<dyn Collective>,
}

impl Rank {
    /// This rank's share of one step. Rank 0 returns the whole `[rows, vocab]` logits, which
    /// the runner samples from; the other ranks return nothing.
    fn forward(&mut self, batch: &ForwardBatch) -> Vec<f32> {
        let c = self.runner.model().config.clone();
        let h = c.hidden_size;
        let (offsets, positions) = batch_rows(batch);
        // BEGIN SOLUTION
        let model = self.runner.model();
        let own = &self.vocabs[self.group.rank()];
        let mut x = vec![0.0f32; positions.len() * h];
        for (row, &tok) in batch.seqs.iter().flat_map(|s| &s.tokens).enumerate() {
            let tok = tok as usize;
            if own.contains(&tok) {
                let at = (tok - own.start) * h;
                x[row * h..(row + 1) * h].copy_from_slice(&model.embed[at..at + h]);
            }
        }
        self.group.all_reduce_sum(&mut x);
        let (cos, sin) = c.rope.tables(&positions);
        for l in 0..c.num_layers {
            let rope = (cos.as_slice(), sin.as_slice());
            let mut o = self
                .runner
                .attention_block(l, &x, batch, &offsets, rope, &PagedAttention);
            self.group.all_reduce_sum(&mut o);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let mut down = self.runner.mlp_block(l, &x);
            self.group.all_reduce_sum(&mut down);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        let model = self.runner.model();
        let mut rows = sampled_rows(batch, &offsets, &x, h);
        rms_norm(&mut rows, &model.final_norm, c.rms_norm_eps);
        let n = rows.len() / h;
        let local = matmul(&rows, model.output_matrix(), n, h, c.vocab_size);
        let gathered = self.group.all_gather(&local);
        if self.group.rank() != 0 {
            return Vec::new();
        }
        // `gathered` is rank 0's [n, v0] block, then rank 1's [n, v1], ...: interleave the rows.
        let vocab_size = self.vocabs.last().map_or(0, |v| v.end);
        let mut logits = vec![0.0f32; n * vocab_size];
        let mut at = 0;
        for v in self.vocabs.iter() {
            for i in 0..n {
                logits[i * vocab_size + v.start..i * vocab_size + v.end]
                    .copy_from_slice(&gathered[at + i * v.len()..at + (i + 1) * v.len()]);
            }
            at += n * v.len();
        }
        logits
        // END SOLUTION
    }
}

/// `tensor_parallel_size` CPU ranks running one model.
pub struct TpCpuRunner {
    ranks: Vec<Rank>,
    config: ModelConfig,
}

impl TpCpuRunner {
    /// Splits `model_config`'s weights over `tp` ranks, each with a K/V store of `num_pages`
    /// pages of `page_size` tokens for its heads.
    pub fn new(
        model_config: &ModelConfig,
        weights: &Weights,
        tp: usize,
        num_pages: usize,
        page_size: usize,
    ) -> Result<Self, Error> {
        check_split(model_config, tp).map_err(|reason| Error::model_load("config.json", reason))?;
        let model = phase2::Model::from_weights(model_config.clone(), weights)?;
        Ok(Self::from_model(&model, tp, num_pages, page_size))
    }

    fn from_model(model: &phase2::Model, tp: usize, num_pages: usize, page_size: usize) -> Self {
        let shards = (0..tp).map(|rank| Shard {
            rank,
            world_size: tp,
        });
        let vocabs: Arc<[Range<usize>]> = shards.clone().map(|s| s.vocab(&model.config)).collect();
        let ranks = ThreadGroup::new(tp)
            .into_iter()
            .zip(shards)
            .map(|(group, shard)| Rank {
                runner: CpuRunner::new(shard.slice(model), num_pages, page_size),
                vocabs: vocabs.clone(),
                group: Box::new(group),
            })
            .collect();
        Self {
            ranks,
            config: model.config.clone(),
        }
    }

    pub fn tensor_parallel_size(&self) -> usize {
        self.ranks.len()
    }

    fn limits(&self) -> BatchLimits {
        BatchLimits {
            vocab_size: self.config.vocab_size,
            ..self.ranks[0].runner.limits()
        }
    }
}

impl ModelRunner for TpCpuRunner {
    /// The K/V of one rank: what each rank's memory holds per token.
    fn kv_layout(&self) -> KvLayout {
        self.ranks[0].runner.kv_layout()
    }

    fn num_pages(&self) -> usize {
        self.ranks[0].runner.num_pages()
    }

    fn page_size(&self) -> usize {
        self.ranks[0].runner.page_size()
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        validate_batch(batch, &self.limits())?;
        let vocab_size = self.config.vocab_size;
        let mut outputs: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .ranks
                .iter_mut()
                .map(|rank| s.spawn(move || rank.forward(batch)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a rank's forward pass panicked"))
                .collect()
        });
        Ok(Logits {
            vocab_size,
            data: outputs.swap_remove(0),
        })
    }
}

impl ChunkRunner for TpCpuRunner {
    /// Every rank copies (and turns) the K/V of its own heads.
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        for rank in &mut self.ranks {
            copy_kv_rotated(&mut rank.runner, src, dst, rope_shift)?;
        }
        Ok(())
    }

    /// Ranks attend page by page (no cascade), so nothing is planned.
    fn cascade_stats(&self) -> CascadeStats {
        CascadeStats::default()
    }
}

/// The tensor-parallel CPU runner the config asks for (`tensor_parallel_size` ranks), its pages
/// sized per rank from `num_kvcache_blocks` or the byte budget: a rank holds `1 / tp` of the
/// K/V heads, so the same budget holds `tp` times the tokens.
pub fn tp_cpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<dyn ChunkRunner>, phase6::Error> {
    let tp = config.tensor_parallel_size;
    check_split(&model_config, tp).map_err(phase6::Error::InvalidConfig)?;
    let model = load_cpu_model(model_config, weights)?;
    let rank0 = Shard {
        rank: 0,
        world_size: tp,
    };
    let layout = CpuRunner::kv_layout_of(&rank0.slice(&model));
    let pages = cpu_kv_pages(&layout, config)?;
    let ps = config.kvcache_block_size;
    let report = format!(
        "device cpu, tensor parallel over {tp} ranks: KV cache of {pages} pages x {ps} tokens = {} tokens, {:.1} MiB a rank (f32)",
        pages * ps,
        (pages * layout.page_bytes(ps)) as f64 / (1 << 20) as f64
    );
    Ok(Runner {
        runner: Box::new(TpCpuRunner::from_model(&model, tp, pages, ps)),
        device: Device::Cpu,
        report,
    })
}
