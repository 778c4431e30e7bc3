//! Paged attention over KV segments, with mergeable partial results.
//!
//! Attention for one query reads every key and value it may see through the sequence's page
//! lists (vLLM's PagedAttention). It is computed *online* (FlashAttention): keys arrive page by
//! page and a running maximum `m`, sum `l` and weighted sum `acc` are updated, so no full row
//! of scores is ever stored.

use phase1::BlockTable;
use rayon::prelude::*;

use crate::kv_store::KvStore;
use crate::ops::dot;

/// Online-softmax states of `n` (query, head) pairs, each over `head_dim` values.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnState {
    pub head_dim: usize,
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub acc: Vec<f32>,
}

impl AttnState {
    pub fn new(n: usize, head_dim: usize) -> Self {
        Self {
            head_dim,
            m: vec![f32::NEG_INFINITY; n],
            l: vec![0.0; n],
            acc: vec![0.0; n * head_dim],
        }
    }

    /// Folds a block of scores (and the matching value rows) into state `i`.
    fn update(&mut self, i: usize, scores: &[f32], values: &[f32]) {
        // BEGIN SOLUTION
        let d = self.head_dim;
        let block_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if block_max == f32::NEG_INFINITY {
            return;
        }
        let new_m = self.m[i].max(block_max);
        let rescale = (self.m[i] - new_m).exp();
        let acc = &mut self.acc[i * d..(i + 1) * d];
        acc.iter_mut().for_each(|a| *a *= rescale);
        let mut l = self.l[i] * rescale;
        for (s, v) in scores.iter().zip(values.chunks_exact(d)) {
            let p = (s - new_m).exp();
            l += p;
            acc.iter_mut().zip(v).for_each(|(a, x)| *a += p * x);
        }
        self.m[i] = new_m;
        self.l[i] = l;
        // END SOLUTION
    }

    /// The attention output of pair `i`: the weighted mean of the values.
    pub fn output(&self, i: usize) -> impl Iterator<Item = f32> + '_ {
        let d = self.head_dim;
        let l = self.l[i];
        self.acc[i * d..(i + 1) * d]
            .iter()
            .map(move |a| if l > 0.0 { a / l } else { 0.0 })
    }

    /// The outputs of a `[head][token]` state as rows `[token][head * head_dim]`.
    pub fn rows(&self, num_heads: usize) -> Vec<f32> {
        let d = self.head_dim;
        let n = self.m.len() / num_heads;
        let mut out = vec![0.0f32; n * num_heads * d];
        for t in 0..n {
            for head in 0..num_heads {
                let dst = &mut out[(t * num_heads + head) * d..][..d];
                dst.iter_mut()
                    .zip(self.output(head * n + t))
                    .for_each(|(o, v)| *o = v);
            }
        }
        out
    }
}

/// The queries of one attention call: `n` tokens, all query heads, and for each token the
/// highest KV index it may see (its own logical index under the causal mask).
pub struct Queries<'a> {
    /// `[token][head][head_dim]`, already rotated.
    pub q: &'a [f32],
    pub num_heads: usize,
    pub visible: &'a [usize],
}

/// Attends every query to the keys of one segment that starts at logical index `start`,
/// folding the scores into `state` (indexed `[head][token]`). Pages are the outer loop and the
/// queries of a KV head the inner one, so a page is read once for all of them.
pub fn attend_segment(
    store: &KvStore,
    layer: usize,
    segment: &BlockTable,
    start: usize,
    queries: &Queries,
    scale: f32,
    state: &mut AttnState,
) {
    let d = state.head_dim;
    let n = queries.visible.len();
    let group = queries.num_heads / store.num_kv_heads();
    let page_size = store.page_size();
    // One chunk of states per KV head: its `group` query heads for every token.
    state
        .m
        .par_chunks_mut(group * n)
        .zip(state.l.par_chunks_mut(group * n))
        .zip(state.acc.par_chunks_mut(group * n * d))
        .enumerate()
        .for_each(|(kv_head, ((m, l), acc))| {
            let mut part = AttnState {
                head_dim: d,
                m: m.to_vec(),
                l: l.to_vec(),
                acc: acc.to_vec(),
            };
            let mut scores = vec![0.0f32; page_size];
            for (p, &page) in segment.pages().iter().enumerate() {
                let first = start + p * page_size;
                let filled = (segment.num_tokens() - p * page_size).min(page_size);
                let (keys, values) = store.page(layer, page, kv_head);
                for g in 0..group {
                    let head = kv_head * group + g;
                    for t in 0..n {
                        // Keys this query may see in this page (causal mask).
                        let seen = queries.visible[t]
                            .saturating_add(1)
                            .saturating_sub(first)
                            .min(filled);
                        if seen == 0 {
                            continue;
                        }
                        let q = &queries.q[(t * queries.num_heads + head) * d..][..d];
                        for (s, k) in scores[..seen].iter_mut().zip(keys.chunks_exact(d)) {
                            *s = dot(q, k) * scale;
                        }
                        part.update(g * n + t, &scores[..seen], &values[..seen * d]);
                    }
                }
            }
            m.copy_from_slice(&part.m);
            l.copy_from_slice(&part.l);
            acc.copy_from_slice(&part.acc);
        });
}
