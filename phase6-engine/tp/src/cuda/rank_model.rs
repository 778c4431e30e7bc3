//! Chapter 6.5: one GPU rank's forward pass: chapter 6.4's blocks on the rank's slices, joined
//! by NCCL collectives.
//!
//! Per step: the embedding of the rank's vocabulary slice (zero rows for other ids) is
//! all-reduced into the whole residual stream; in every layer the attention block's output
//! projection and the MLP's down projection leave a partial sum (this rank's heads, this rank's
//! intermediate slice) that is all-reduced before it is added in — the product's buffer as it
//! is, bf16 or, when a thin step splits it, f32 split-K partials, which sum the same way. The
//! lm_head gives the logits of the rank's vocabulary slice; an all-gather gives every rank all
//! of them, joined into whole rows, so every rank samples the same token (the same logits, the
//! same seeds) and any rank's answer is the step's.

use kernels::{CudaSlice, Gpu, Result, gather, linear};
use phase6_cuda::forward::{HiddenOut, ProductMut, attention_block, final_rows, mlp_block};
use phase6_cuda::{Activations, DeviceModel, DeviceWeights, Dims, KvCache, StepInputs};

use crate::cuda::nccl::NcclGroup;

/// A rank's weights, its link to the other ranks, and the buffers of the logits exchange.
pub struct RankModel {
    weights: DeviceWeights,
    group: NcclGroup,
    /// The rank's vocabulary slice starts at `rank * each`; every slice is `each` rows.
    each: usize,
    /// The rank's logits `f32[max_seqs, each]` and every rank's `f32[ranks, max_seqs, each]`.
    local: CudaSlice<f32>,
    parts: CudaSlice<f32>,
}

impl RankModel {
    pub fn new(
        gpu: &Gpu,
        weights: DeviceWeights,
        group: NcclGroup,
        each: usize,
        max_seqs: usize,
    ) -> Result<Self> {
        let ranks = group.world_size();
        Ok(Self {
            local: gpu.zeros(max_seqs * each)?,
            parts: gpu.zeros(ranks * max_seqs * each)?,
            weights,
            group,
            each,
        })
    }

    /// Sums a product over the ranks, in place.
    fn all_reduce(&self, a: &mut Activations, out: HiddenOut, t: usize, h: usize) -> Result<()> {
        match a.product_mut(out, t, h) {
            ProductMut::Whole(mut x) => self.group.all_reduce_sum(&mut x),
            ProductMut::Partials(mut x) => self.group.all_reduce_sum(&mut x),
        }
    }
}

impl DeviceModel for RankModel {
    fn forward(
        &mut self,
        gpu: &Gpu,
        m: &Dims,
        a: &mut Activations,
        kv: &mut KvCache,
        s: &StepInputs<'_>,
    ) -> Result<()> {
        let (t, h, w) = (s.num_tokens(), m.hidden, &self.weights);
        let first = self.group.rank() * self.each;
        gather::embedding_slice(gpu, s.ids(), &w.embed, (first, self.each), a.resid_mut(), h)?;
        self.group
            .all_reduce_sum(&mut a.resid_mut().slice_mut(..t * h))?;
        let mut mlp_out = None;
        for l in 0..m.layers {
            let attn_out = attention_block(gpu, m, l, w, a, kv, s, mlp_out, true)?;
            self.all_reduce(a, attn_out, t, h)?;
            let out = mlp_block(gpu, m, l, w, a, attn_out, t, true)?;
            self.all_reduce(a, out, t, h)?;
            mlp_out = Some(out);
        }
        final_rows(gpu, m, w, a, s, mlp_out)?;
        let (rows, each) = (s.num_sampled(), self.each);
        if rows == 0 {
            return Ok(());
        }
        linear::linear(gpu, a.last(), w.output(), &mut self.local, rows, each, h)?;
        let ranks = self.group.world_size();
        self.group.all_gather(
            &self.local.slice(..rows * each),
            &mut self.parts.slice_mut(..ranks * rows * each),
        )?;
        gather::join_vocab_slices(gpu, &self.parts, &mut a.logits, rows, m.vocab, each)
    }

    fn weights(&self) -> &DeviceWeights {
        &self.weights
    }

    /// Every collective needs the other ranks: a step is never run by one rank alone.
    fn may_repeat_alone(&self) -> bool {
        false
    }
}
