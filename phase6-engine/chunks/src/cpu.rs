//! The chunk API's runner on the CPU: chapter 2's runner with cascade attention and RoPE-shifted
//! K/V copies.
//!
//! Cascade attention replaces only the attention of each layer ([`phase2::BatchAttention`]):
//! the queries of every sequence of a group are attended to the shared segment at once, each
//! sequence attends to its other segments alone, and the two partial states are merged by
//! log-sum-exp ([`merge_states`], FlashInfer's "merge states"), which is exact.

use phase1::{BlockTable, KvLayout};
use phase2::attention::{AttnState, Queries, attend_segment};
use phase2::ops::apply_rope;
use phase2::{
    BatchAttention, CpuRunner, Error, ForwardBatch, LayerAttention, Logits, ModelConfig,
    ModelRunner, PagedAttention, Weights,
};
use phase6::{Config, Runner, cpu_runner};
use rayon::prelude::*;

use crate::cascade::{CascadeStats, SharedSegment, plan_cascade};
use crate::{ChunkRunner, check_copy_kv};

/// [`CpuRunner`] that plans cascade attention for every step and copies K/V between pages.
pub struct CascadeCpuRunner {
    inner: CpuRunner,
    stats: CascadeStats,
}

impl CascadeCpuRunner {
    pub fn new(inner: CpuRunner) -> Self {
        Self {
            inner,
            stats: CascadeStats::default(),
        }
    }

    /// One step with the cascade groups given (an empty plan is paged attention).
    pub fn forward_planned(
        &mut self,
        batch: &ForwardBatch,
        plan: &[SharedSegment],
    ) -> Result<Logits, Error> {
        if plan.is_empty() {
            self.inner.forward_with(batch, &PagedAttention)
        } else {
            self.inner.forward_with(batch, &CascadeAttention { plan })
        }
    }
}

/// The CPU runner of chapter 6.1, as a chunk runner.
pub fn chunk_cpu_runner(
    model_config: ModelConfig,
    weights: &Weights,
    config: &Config,
) -> Result<Runner<dyn ChunkRunner>, phase6::Error> {
    let Runner {
        runner,
        device,
        report,
    } = cpu_runner(model_config, weights, config)?;
    Ok(Runner {
        runner: Box::new(CascadeCpuRunner::new(*runner)),
        device,
        report,
    })
}

/// Attention with the plan's shared segments read once per group.
struct CascadeAttention<'a> {
    plan: &'a [SharedSegment],
}

impl BatchAttention for CascadeAttention<'_> {
    fn attend(&self, a: &LayerAttention) -> Vec<f32> {
        let (nh, d) = (a.num_heads, a.head_dim);
        let mut partials: Vec<Vec<(usize, AttnState)>> = vec![Vec::new(); a.batch.seqs.len()];
        for group in self.plan {
            let gq: Vec<f32> = group
                .seqs
                .iter()
                .flat_map(|&i| a.queries_of(i).iter().copied())
                .collect();
            let total = gq.len() / (nh * d);
            // Every query sees the whole shared segment: it lies before all of them.
            let visible = vec![usize::MAX; total];
            let queries = Queries {
                q: &gq,
                num_heads: nh,
                visible: &visible,
            };
            let mut state = AttnState::new(nh * total, d);
            let seg = &a.batch.seqs[group.seqs[0]].kv[group.segment];
            attend_segment(a.store, a.layer, seg, 0, &queries, a.scale(), &mut state);
            let mut at = 0;
            for &i in &group.seqs {
                let n = a.batch.seqs[i].tokens.len();
                partials[i].push((group.segment, slice_state(&state, nh, total, at, n)));
                at += n;
            }
        }
        let outputs: Vec<Vec<f32>> = partials
            .into_par_iter()
            .enumerate()
            .map(|(i, shared)| {
                let mut state = a.sequence_state(i, |k| shared.iter().all(|(seg, _)| *seg != k));
                for (_, part) in &shared {
                    merge_states(&mut state, part);
                }
                state.rows(nh)
            })
            .collect();
        outputs.concat()
    }
}

/// Merges `other` (the same (query, head) pairs, attended to other keys) into `state`: the
/// result is the state over both sets of keys, exactly. With `m` the running maximum, `l` the
/// sum of `e^(s - m)` and `acc` the sum of `e^(s - m) v`, both sides are rescaled to the larger
/// maximum and added.
pub fn merge_states(state: &mut AttnState, other: &AttnState) {
    // BEGIN SOLUTION
    let d = state.head_dim;
    for i in 0..state.m.len() {
        let m = state.m[i].max(other.m[i]);
        if m == f32::NEG_INFINITY {
            continue;
        }
        let (a, b) = ((state.m[i] - m).exp(), (other.m[i] - m).exp());
        state.l[i] = state.l[i] * a + other.l[i] * b;
        for j in 0..d {
            state.acc[i * d + j] = state.acc[i * d + j] * a + other.acc[i * d + j] * b;
        }
        state.m[i] = m;
    }
    // END SOLUTION
}

/// The states of tokens `at..at + n` of a `[head][token]` state over `total` tokens.
fn slice_state(
    state: &AttnState,
    num_heads: usize,
    total: usize,
    at: usize,
    n: usize,
) -> AttnState {
    let d = state.head_dim;
    let mut out = AttnState::new(num_heads * n, d);
    for h in 0..num_heads {
        let (src, dst) = (h * total + at, h * n);
        out.m[dst..dst + n].copy_from_slice(&state.m[src..src + n]);
        out.l[dst..dst + n].copy_from_slice(&state.l[src..src + n]);
        out.acc[dst * d..(dst + n) * d].copy_from_slice(&state.acc[src * d..(src + n) * d]);
    }
    out
}

impl ModelRunner for CascadeCpuRunner {
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
        let plan = plan_cascade(batch);
        self.stats.record(batch, &plan);
        self.forward_planned(batch, &plan)
    }
}

/// [`ChunkRunner::copy_kv`] on a CPU runner's store: every layer's K/V of `src` copied into the
/// slots of `dst`, keys turned by `rope_shift` positions.
pub fn copy_kv_rotated(
    runner: &mut CpuRunner,
    src: &BlockTable,
    dst: &BlockTable,
    rope_shift: i64,
) -> Result<(), Error> {
    let (ps, pages) = (runner.page_size(), runner.num_pages());
    check_copy_kv(src, dst, ps, pages)?;
    let c = runner.model().config.clone();
    // One rotation for every token: the angle depends only on the shift.
    let (cos, sin) = c.rope.shift_tables(rope_shift);
    let store = runner.store_mut();
    for layer in 0..c.num_layers {
        for i in 0..src.num_tokens() {
            let (a, b) = (src.slot(i, ps), dst.slot(i, ps));
            store.copy_slot(layer, (a.page, a.offset), (b.page, b.offset), |k| {
                apply_rope(k, &cos, &sin)
            });
        }
    }
    Ok(())
}

impl ChunkRunner for CascadeCpuRunner {
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        copy_kv_rotated(&mut self.inner, src, dst, rope_shift)
    }

    fn cascade_stats(&self) -> CascadeStats {
        self.stats
    }
}
