//! The forward pass on the CPU: a whole batch of prefill pieces and decode tokens per call.
//!
//! All tokens of the batch go through each linear layer together (one matrix product per
//! layer, whatever the mix of sequences), which is what makes batching pay. Only attention is
//! per sequence: each new token writes its K/V into its page slot, then reads its sequence's
//! KV back through the page lists. Attention is the one part of the step that depends on how
//! the K/V is shared, so it is a parameter of [`CpuRunner::forward_with`] ([`BatchAttention`]).

use phase1::{KvDtype, KvLayout};
use rayon::prelude::*;

use crate::attention::{AttnState, Queries, attend_segment};
use crate::error::Error;
use crate::kv_store::KvStore;
use crate::model::Model;
use crate::ops::{apply_rope, matmul, rms_norm, silu_mul};
use crate::runner::{BatchLimits, ForwardBatch, Logits, ModelRunner, validate_batch};

/// What the attention of one layer reads: the K/V store (this step's K/V already written),
/// the batch, and the rotated queries of all its tokens.
pub struct LayerAttention<'a> {
    pub store: &'a KvStore,
    pub layer: usize,
    pub batch: &'a ForwardBatch,
    /// The row of each sequence's first token in `q`.
    pub offsets: &'a [usize],
    /// `[token][head][head_dim]` for every token of the batch.
    pub q: &'a [f32],
    pub num_heads: usize,
    pub head_dim: usize,
}

impl LayerAttention<'_> {
    /// `1 / sqrt(head_dim)`.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The queries of sequence `i`: its rows of `q`.
    pub fn queries_of(&self, i: usize) -> &[f32] {
        let (off, n) = (self.offsets[i], self.batch.seqs[i].tokens.len());
        let qd = self.num_heads * self.head_dim;
        &self.q[off * qd..(off + n) * qd]
    }

    /// Sequence `i`'s queries attended (causally) to those of its segments that `read`
    /// selects by index, as a `[head][token]` state.
    pub fn sequence_state(&self, i: usize, read: impl Fn(usize) -> bool) -> AttnState {
        let s = &self.batch.seqs[i];
        let n = s.tokens.len();
        let visible: Vec<usize> = (s.start_pos..s.start_pos + n).collect();
        let queries = Queries {
            q: self.queries_of(i),
            num_heads: self.num_heads,
            visible: &visible,
        };
        let mut state = AttnState::new(self.num_heads * n, self.head_dim);
        let mut start = 0;
        for (k, seg) in s.kv.iter().enumerate() {
            if read(k) {
                let scale = self.scale();
                attend_segment(
                    self.store, self.layer, seg, start, &queries, scale, &mut state,
                );
            }
            start += seg.num_tokens();
        }
        state
    }
}

/// How one layer's attention is computed for a batch: returns `[token][heads * head_dim]`.
pub trait BatchAttention: Sync {
    fn attend(&self, input: &LayerAttention) -> Vec<f32>;
}

/// Paged attention: every sequence reads all its segments on its own (vLLM's PagedAttention).
pub struct PagedAttention;

impl BatchAttention for PagedAttention {
    fn attend(&self, input: &LayerAttention) -> Vec<f32> {
        let outputs: Vec<Vec<f32>> = (0..input.batch.seqs.len())
            .into_par_iter()
            .map(|i| input.sequence_state(i, |_| true).rows(input.num_heads))
            .collect();
        outputs.concat()
    }
}

pub struct CpuRunner {
    model: Model,
    store: KvStore,
}

impl CpuRunner {
    /// A runner with K/V storage for `num_pages` pages of `page_size` tokens.
    pub fn new(model: Model, num_pages: usize, page_size: usize) -> Self {
        let c = &model.config;
        let store = KvStore::new(
            c.num_layers,
            num_pages,
            page_size,
            c.num_kv_heads,
            c.head_dim,
        );
        Self { model, store }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The K/V shape of a model as this runner stores it (f32).
    pub fn kv_layout_of(model: &Model) -> KvLayout {
        KvLayout {
            num_layers: model.config.num_layers,
            num_kv_heads: model.config.num_kv_heads,
            head_dim: model.config.head_dim,
            dtype: KvDtype::F32,
        }
    }

    /// What this runner can take in one step.
    pub fn limits(&self) -> BatchLimits {
        let c = &self.model.config;
        BatchLimits {
            page_size: self.store.page_size(),
            num_pages: self.store.num_pages(),
            vocab_size: c.vocab_size,
            max_position: c.max_position_embeddings,
            max_seqs: usize::MAX,
            max_tokens: usize::MAX,
        }
    }

    /// The K/V storage, for a later chapter's operations on pages (copies between them).
    pub fn store_mut(&mut self) -> &mut KvStore {
        &mut self.store
    }

    /// The attention half of decoder layer `l` over all rows of `x`: norm, q/k/v, q/k norm and
    /// RoPE, the new K/V into their pages, attention, and the output projection. Returns what
    /// the layer adds to `x` (the residual add is the caller's: under tensor parallelism each
    /// rank's share is summed over the ranks first, chapter 6.5).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_block(
        &mut self,
        l: usize,
        x: &[f32],
        batch: &ForwardBatch,
        offsets: &[usize],
        rope: (&[f32], &[f32]),
        attention: &impl BatchAttention,
    ) -> Vec<f32> {
        let (cos, sin) = rope;
        let c = &self.model.config;
        let layer = &self.model.layers[l];
        let (h, d, t) = (c.hidden_size, c.head_dim, x.len() / c.hidden_size);
        let (qd, kvd) = (c.num_heads * d, c.num_kv_heads * d);
        let width = c.qkv_width();
        let half = d / 2;
        // BEGIN SOLUTION
        let mut normed = x.to_vec();
        rms_norm(&mut normed, &layer.input_norm, c.rms_norm_eps);
        let mut qkv = matmul(&normed, &layer.qkv, t, h, width);
        if let Some(bias) = &layer.qkv_bias {
            qkv.chunks_exact_mut(width)
                .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
        }
        // q/k norm and RoPE, per token and head; q gathered contiguously for attention.
        let mut q = vec![0.0f32; t * qd];
        for (i, row) in qkv.chunks_exact_mut(width).enumerate() {
            let (qs, rest) = row.split_at_mut(qd);
            let ks = &mut rest[..kvd];
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                rms_norm(qs, qn, c.rms_norm_eps);
                rms_norm(ks, kn, c.rms_norm_eps);
            }
            let (cs, sn) = (
                &cos[i * half..(i + 1) * half],
                &sin[i * half..(i + 1) * half],
            );
            qs.chunks_exact_mut(d)
                .for_each(|head| apply_rope(head, cs, sn));
            ks.chunks_exact_mut(d)
                .for_each(|head| apply_rope(head, cs, sn));
            q[i * qd..(i + 1) * qd].copy_from_slice(qs);
        }
        // New K/V into their page slots.
        let ps = self.store.page_size();
        for (s, &off) in batch.seqs.iter().zip(offsets) {
            let own = s.kv.last().expect("validated");
            let first_own = own.num_tokens() - s.tokens.len();
            for j in 0..s.tokens.len() {
                let slot = own.slot(first_own + j, ps);
                let row = &qkv[(off + j) * width..(off + j + 1) * width];
                self.store.write(
                    l,
                    slot.page,
                    slot.offset,
                    &row[qd..qd + kvd],
                    &row[qd + kvd..],
                );
            }
        }
        let attn = attention.attend(&LayerAttention {
            store: &self.store,
            layer: l,
            batch,
            offsets,
            q: &q,
            num_heads: c.num_heads,
            head_dim: d,
        });
        matmul(&attn, &layer.o_proj, t, qd, h)
        // END SOLUTION
    }

    /// The MLP half of decoder layer `l` (SwiGLU) over all rows of `x`; returns what the layer
    /// adds to `x`.
    pub fn mlp_block(&self, l: usize, x: &[f32]) -> Vec<f32> {
        let c = &self.model.config;
        let layer = &self.model.layers[l];
        let (h, t) = (c.hidden_size, x.len() / c.hidden_size);
        // BEGIN SOLUTION
        let mut normed = x.to_vec();
        rms_norm(&mut normed, &layer.post_norm, c.rms_norm_eps);
        let gate_up = matmul(&normed, &layer.gate_up, t, h, 2 * c.intermediate_size);
        let act = silu_mul(&gate_up, c.intermediate_size);
        matmul(&act, &layer.down, t, c.intermediate_size, h)
        // END SOLUTION
    }
}

/// The row of each sequence's first token in the batch's concatenated tokens, and every
/// token's position in its sequence.
pub fn batch_rows(batch: &ForwardBatch) -> (Vec<usize>, Vec<usize>) {
    let mut offsets = Vec::with_capacity(batch.seqs.len());
    let mut positions = Vec::with_capacity(batch.num_tokens());
    for s in &batch.seqs {
        offsets.push(positions.len());
        positions.extend(s.start_pos..s.start_pos + s.tokens.len());
    }
    (offsets, positions)
}

/// The rows of `x` (`width` wide) that need logits: the last token of each sampling sequence.
pub fn sampled_rows(batch: &ForwardBatch, offsets: &[usize], x: &[f32], width: usize) -> Vec<f32> {
    let mut rows = Vec::new();
    for (s, &off) in batch.seqs.iter().zip(offsets) {
        if s.sample.is_some() {
            let last = off + s.tokens.len() - 1;
            rows.extend_from_slice(&x[last * width..(last + 1) * width]);
        }
    }
    rows
}

impl ModelRunner for CpuRunner {
    fn kv_layout(&self) -> KvLayout {
        Self::kv_layout_of(&self.model)
    }

    fn num_pages(&self) -> usize {
        self.store.num_pages()
    }

    fn page_size(&self) -> usize {
        self.store.page_size()
    }

    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        self.forward_with(batch, &PagedAttention)
    }
}

impl CpuRunner {
    /// One forward step with `attention` computing each layer's attention.
    pub fn forward_with(
        &mut self,
        batch: &ForwardBatch,
        attention: &impl BatchAttention,
    ) -> Result<Logits, Error> {
        validate_batch(batch, &self.limits())?;
        let c = self.model.config.clone();
        let h = c.hidden_size;
        let (offsets, positions) = batch_rows(batch);
        let mut x = Vec::with_capacity(batch.num_tokens() * h);
        for &tok in batch.seqs.iter().flat_map(|s| &s.tokens) {
            x.extend_from_slice(&self.model.embed[tok as usize * h..(tok as usize + 1) * h]);
        }
        let (cos, sin) = c.rope.tables(&positions);
        for l in 0..c.num_layers {
            let o = self.attention_block(l, &x, batch, &offsets, (&cos, &sin), attention);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let down = self.mlp_block(l, &x);
            x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        }
        // Only the last token of each sampling sequence needs logits.
        let mut rows = sampled_rows(batch, &offsets, &x, h);
        rms_norm(&mut rows, &self.model.final_norm, c.rms_norm_eps);
        let n = rows.len() / h;
        let data = matmul(&rows, self.model.output_matrix(), n, h, c.vocab_size);
        Ok(Logits {
            vocab_size: c.vocab_size,
            data,
        })
    }
}
