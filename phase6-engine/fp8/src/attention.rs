//! Chapter 6.6: attention that reads keys and values as an FP8 cache gives them back.
//!
//! On a GPU the store kernel writes `encode(k / k_scale)` into a one-byte cache and attention
//! dequantizes what it reads, the step's own new tokens included. The CPU reference gets the
//! same numbers without a byte cache. The runner keeps its `f32` store rounded: after each step
//! it rounds what the step wrote ([`crate::Fp8CpuRunner`]). During the step, though, chapter 2
//! has written the new K/V unrounded just before attention reads it, so attention reads a copy
//! of the batch's pages in which the new tokens are rounded too. Rounding is deterministic and
//! rounding twice changes nothing, so this is exactly what reading a stored FP8 cache gives.

use std::collections::HashMap;
use std::sync::OnceLock;

use phase1::BlockTable;
use phase2::{BatchAttention, ForwardBatch, ForwardSeq, KvStore, LayerAttention, PagedAttention};

use crate::scales::{KvScales, amax, through_fp8};

/// Paged attention over FP8 K/V, with the scales of every layer. A layer whose scales are not
/// set yet takes them from the K/V this step writes (calibration) and keeps them.
pub struct Fp8Attention<'a> {
    pub scales: &'a [OnceLock<KvScales>],
}

impl BatchAttention for Fp8Attention<'_> {
    fn attend(&self, input: &LayerAttention) -> Vec<f32> {
        let scales = *self.scales[input.layer].get_or_init(|| calibrate(input));
        let (store, batch) = rounded_pages(input, scales);
        PagedAttention.attend(&LayerAttention {
            store: &store,
            layer: 0,
            batch: &batch,
            offsets: input.offsets,
            q: input.q,
            num_heads: input.num_heads,
            head_dim: input.head_dim,
        })
    }
}

/// The (page, slot) of every token a step writes: the last `tokens.len()` of each sequence's
/// own segment.
pub fn new_slots(batch: &ForwardBatch, page_size: usize) -> Vec<(u32, usize)> {
    let mut slots = Vec::with_capacity(batch.num_tokens());
    for s in &batch.seqs {
        let own = s.kv.last().expect("a validated batch");
        let first = own.num_tokens() - s.tokens.len();
        slots.extend((first..own.num_tokens()).map(|i| {
            let slot = own.slot(i, page_size);
            (slot.page, slot.offset)
        }));
    }
    slots
}

/// One token's K and V, every head (of `d` values), as stored in `slot` of layer `layer`.
pub fn read_slot(
    store: &KvStore,
    layer: usize,
    d: usize,
    (page, offset): (u32, usize),
) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for head in 0..store.num_kv_heads() {
        let (ks, vs) = store.page(layer, page, head);
        k.extend_from_slice(&ks[offset * d..(offset + 1) * d]);
        v.extend_from_slice(&vs[offset * d..(offset + 1) * d]);
    }
    (k, v)
}

/// Rounds one token's K and V (every head) in `slot` of layer `layer` through FP8, in place.
pub fn round_slot(
    store: &mut KvStore,
    layer: usize,
    d: usize,
    slot: (u32, usize),
    scales: KvScales,
) {
    let (mut k, mut v) = read_slot(store, layer, d, slot);
    k.iter_mut()
        .for_each(|x| *x = through_fp8(*x, scales.k_scale));
    v.iter_mut()
        .for_each(|x| *x = through_fp8(*x, scales.v_scale));
    store.write(layer, slot.0, slot.1, &k, &v);
}

/// Scales from the K/V the step just wrote into layer `input.layer` (`amax / 448`).
fn calibrate(input: &LayerAttention) -> KvScales {
    let (mut k_amax, mut v_amax) = (0.0f32, 0.0f32);
    for slot in new_slots(input.batch, input.store.page_size()) {
        let (k, v) = read_slot(input.store, input.layer, input.head_dim, slot);
        k_amax = k_amax.max(amax(&k));
        v_amax = v_amax.max(amax(&v));
    }
    KvScales::from_amax(k_amax, v_amax)
}

/// The pages the batch reads in layer `input.layer` as a one-layer store of just those pages,
/// with the step's new K/V rounded through FP8 (the rest is rounded already), and the batch
/// with its page ids renumbered into it.
fn rounded_pages(input: &LayerAttention, scales: KvScales) -> (KvStore, ForwardBatch) {
    let (store, d) = (input.store, input.head_dim);
    let ps = store.page_size();
    let mut order: Vec<u32> = Vec::new();
    let mut index: HashMap<u32, u32> = HashMap::new();
    let mut renumber = |table: &BlockTable| {
        let pages = table
            .pages()
            .iter()
            .map(|&p| {
                *index.entry(p).or_insert_with(|| {
                    order.push(p);
                    (order.len() - 1) as u32
                })
            })
            .collect();
        BlockTable::from_pages(pages, table.num_tokens())
    };
    let seqs: Vec<ForwardSeq> = input
        .batch
        .seqs
        .iter()
        .map(|s| ForwardSeq {
            kv: s.kv.iter().map(&mut renumber).collect(),
            ..s.clone()
        })
        .collect();
    // BEGIN SOLUTION
    let mut rounded = KvStore::new(1, order.len(), ps, store.num_kv_heads(), d);
    for (new, &old) in order.iter().enumerate() {
        for offset in 0..ps {
            let (k, v) = read_slot(store, input.layer, d, (old, offset));
            rounded.write(0, new as u32, offset, &k, &v);
        }
    }
    let batch = ForwardBatch { seqs };
    for slot in new_slots(&batch, ps) {
        round_slot(&mut rounded, 0, d, slot, scales);
    }
    (rounded, batch)
    // END SOLUTION
}
