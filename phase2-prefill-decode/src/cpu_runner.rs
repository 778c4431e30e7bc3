//! The forward pass on the CPU: a whole batch of prefill pieces and decode tokens per call.
//!
//! All tokens of the batch go through each linear layer together (one matrix product per
//! layer, whatever the mix of sequences), which is what makes batching pay. Only attention is
//! per sequence: each new token writes its K/V into its page slot, then reads its sequence's
//! KV back through the page lists. Segments shared by several sequences of the batch (a cascade
//! plan) are attended once for all their queries and merged per query by log-sum-exp.

use phase1::{BlockTable, KvDtype, KvLayout};
use rayon::prelude::*;

use crate::attention::{AttnState, Queries, attend_segment};
use crate::error::Error;
use crate::kv_store::KvStore;
use crate::model::Model;
use crate::ops::{apply_rope, matmul, rms_norm, rope_tables, rope_tables_signed, silu_mul};
use crate::runner::{ForwardBatch, Logits, ModelRunner};

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

    /// Checks everything the forward pass relies on, so a bad batch is an error, not a panic.
    fn validate(&self, batch: &ForwardBatch) -> Result<(), Error> {
        let c = &self.model.config;
        let ps = self.store.page_size();
        let bad = |s: String| Err(Error::InvalidBatch(s));
        for s in &batch.seqs {
            let id = s.seq_id;
            let Some(own) = s.kv.last() else {
                return bad(format!("sequence {id} has no KV segment"));
            };
            if s.tokens.is_empty() {
                return bad(format!("sequence {id} has no tokens to run"));
            }
            let kv_len: usize = s.kv.iter().map(|t| t.num_tokens()).sum();
            if kv_len != s.total_len() || own.num_tokens() < s.tokens.len() {
                return bad(format!(
                    "sequence {id}: its segments hold {kv_len} tokens, expected {} with the last {} in its own segment",
                    s.total_len(),
                    s.tokens.len()
                ));
            }
            if s.total_len() > c.max_position_embeddings {
                return bad(format!(
                    "sequence {id} reaches position {}, beyond the model's {}",
                    s.total_len(),
                    c.max_position_embeddings
                ));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return bad(format!(
                    "sequence {id}: token {t} is outside the vocabulary of {}",
                    c.vocab_size
                ));
            }
            for seg in &s.kv {
                if seg.pages().len() * ps < seg.num_tokens() {
                    return bad(format!(
                        "sequence {id}: a segment of {} tokens has too few pages",
                        seg.num_tokens()
                    ));
                }
                if let Some(&p) = seg
                    .pages()
                    .iter()
                    .find(|&&p| p as usize >= self.store.num_pages())
                {
                    return bad(format!(
                        "sequence {id}: page {p} is outside the store of {}",
                        self.store.num_pages()
                    ));
                }
            }
        }
        for group in &batch.shared {
            let Some(&first) = group.seqs.first() else {
                return bad("a shared segment with no sequences".into());
            };
            for &i in &group.seqs {
                let Some(s) = batch.seqs.get(i) else {
                    return bad(format!(
                        "shared segment names sequence index {i} of {}",
                        batch.seqs.len()
                    ));
                };
                if group.segment + 1 >= s.kv.len() {
                    return bad(format!(
                        "sequence {}: segment {} cannot be shared (it is its own, last segment)",
                        s.seq_id, group.segment
                    ));
                }
                if s.kv[group.segment] != batch.seqs[first].kv[group.segment] {
                    return bad(format!(
                        "sequence {}: shared segment {} differs",
                        s.seq_id, group.segment
                    ));
                }
            }
        }
        Ok(())
    }

    /// One decoder layer over all `tokens` rows of `x`, in place.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &mut self,
        l: usize,
        x: &mut [f32],
        batch: &ForwardBatch,
        offsets: &[usize],
        cos: &[f32],
        sin: &[f32],
    ) {
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
        let attn = self.attention(l, batch, offsets, &q);
        let o = matmul(&attn, &layer.o_proj, t, qd, h);
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

        let mut normed = x.to_vec();
        rms_norm(&mut normed, &layer.post_norm, c.rms_norm_eps);
        let gate_up = matmul(&normed, &layer.gate_up, t, h, 2 * c.intermediate_size);
        let act = silu_mul(&gate_up, c.intermediate_size);
        let down = matmul(&act, &layer.down, t, c.intermediate_size, h);
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        // END SOLUTION
    }

    /// Attention outputs `[tokens][heads * head_dim]` for the whole batch.
    fn attention(&self, l: usize, batch: &ForwardBatch, offsets: &[usize], q: &[f32]) -> Vec<f32> {
        let c = &self.model.config;
        let (d, nh) = (c.head_dim, c.num_heads);
        let qd = nh * d;
        let scale = 1.0 / (d as f32).sqrt();
        let store = &self.store;

        // Shared segments first: all queries of a group against the shared pages at once.
        let mut partials: Vec<Vec<(usize, AttnState)>> = vec![Vec::new(); batch.seqs.len()];
        for group in &batch.shared {
            let mut gq = Vec::new();
            for &i in &group.seqs {
                let (off, n) = (offsets[i], batch.seqs[i].tokens.len());
                gq.extend_from_slice(&q[off * qd..(off + n) * qd]);
            }
            let total = gq.len() / qd;
            let visible = vec![usize::MAX; total];
            let queries = Queries {
                q: &gq,
                num_heads: nh,
                visible: &visible,
            };
            let mut state = AttnState::new(nh * total, d);
            let seg = &batch.seqs[group.seqs[0]].kv[group.segment];
            attend_segment(store, l, seg, 0, &queries, scale, &mut state);
            let mut at = 0;
            for &i in &group.seqs {
                let n = batch.seqs[i].tokens.len();
                partials[i].push((group.segment, slice_state(&state, nh, total, at, n)));
                at += n;
            }
        }

        let outputs: Vec<Vec<f32>> = batch
            .seqs
            .par_iter()
            .zip(partials.into_par_iter())
            .zip(offsets.par_iter())
            .map(|((s, shared), &off)| {
                let n = s.tokens.len();
                let visible: Vec<usize> = (s.start_pos..s.start_pos + n).collect();
                let queries = Queries {
                    q: &q[off * qd..(off + n) * qd],
                    num_heads: nh,
                    visible: &visible,
                };
                let mut state = AttnState::new(nh * n, d);
                let mut start = 0;
                for (k, seg) in s.kv.iter().enumerate() {
                    if !shared.iter().any(|(segment, _)| *segment == k) {
                        attend_segment(store, l, seg, start, &queries, scale, &mut state);
                    }
                    start += seg.num_tokens();
                }
                for (_, part) in &shared {
                    state.merge(part);
                }
                let mut out = vec![0.0f32; n * qd];
                for t in 0..n {
                    for head in 0..nh {
                        let dst = &mut out[t * qd + head * d..][..d];
                        dst.iter_mut()
                            .zip(state.output(head * n + t))
                            .for_each(|(o, v)| *o = v);
                    }
                }
                out
            })
            .collect();
        outputs.concat()
    }
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

    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        let ps = self.store.page_size();
        crate::runner::check_copy_kv(src, dst, ps, self.store.num_pages())?;
        let n = src.num_tokens();
        let c = &self.model.config;
        // One rotation for every token: the angle depends only on the shift.
        let (cos, sin) = rope_tables_signed(rope_shift, c.head_dim, c.rope_theta);
        for layer in 0..c.num_layers {
            for i in 0..n {
                let (a, b) = (src.slot(i, ps), dst.slot(i, ps));
                self.store
                    .copy_slot(layer, (a.page, a.offset), (b.page, b.offset), |k| {
                        apply_rope(k, &cos, &sin)
                    });
            }
        }
        Ok(())
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        self.validate(batch)?;
        let c = self.model.config.clone();
        let h = c.hidden_size;
        let mut offsets = Vec::with_capacity(batch.seqs.len());
        let mut positions = Vec::with_capacity(batch.num_tokens());
        let mut x = Vec::with_capacity(batch.num_tokens() * h);
        for s in &batch.seqs {
            offsets.push(positions.len());
            for (j, &tok) in s.tokens.iter().enumerate() {
                positions.push(s.start_pos + j);
                x.extend_from_slice(&self.model.embed[tok as usize * h..(tok as usize + 1) * h]);
            }
        }
        let (cos, sin) = rope_tables(&positions, c.head_dim, c.rope_theta);
        for l in 0..c.num_layers {
            self.layer(l, &mut x, batch, &offsets, &cos, &sin);
        }
        // Only the last token of each sampling sequence needs logits.
        let mut rows = Vec::new();
        for (s, &off) in batch.seqs.iter().zip(&offsets) {
            if s.sample.is_some() {
                let last = off + s.tokens.len() - 1;
                rows.extend_from_slice(&x[last * h..(last + 1) * h]);
            }
        }
        rms_norm(&mut rows, &self.model.final_norm, c.rms_norm_eps);
        let n = rows.len() / h;
        let data = matmul(&rows, self.model.output_matrix(), n, h, c.vocab_size);
        Ok(Logits {
            vocab_size: c.vocab_size,
            data,
        })
    }
}
