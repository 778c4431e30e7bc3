//! Cascade planning: finding the KV segments that several sequences of a step share.
//!
//! Requests composed from the same registered chunks read the same pages: a system prompt
//! shared by a whole batch, contexts shared by some. FlashInfer's cascade attention attends
//! such a shared segment once for all the queries that read it and merges the partial result
//! into each query's attention by log-sum-exp; for a long shared prefix that turns many reads
//! of the same K/V into one. `CascadeRunner` wraps any runner, writes the plan
//! ([`SharedSegment`]s) into each step and counts what it found.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use phase0::TokenId;
use phase1::{BlockTable, KvLayout};
use phase2::{Error, ForwardBatch, Logits, ModelRunner, SharedSegment};

/// Groups the sequences of a batch by identical segments at the same position in their KV
/// list (never their own, last, segment). Only groups of two or more are worth a cascade.
pub fn plan_cascade(batch: &ForwardBatch) -> Vec<SharedSegment> {
    // BEGIN SOLUTION
    let mut groups: HashMap<(usize, &BlockTable), Vec<usize>> = HashMap::new();
    for (i, seq) in batch.seqs.iter().enumerate() {
        let shared = seq.kv.len().saturating_sub(1);
        for (k, seg) in seq.kv[..shared].iter().enumerate() {
            if !seg.is_empty() {
                groups.entry((k, seg)).or_default().push(i);
            }
        }
    }
    let mut plan: Vec<SharedSegment> = groups
        .into_iter()
        .filter(|(_, seqs)| seqs.len() > 1)
        .map(|((segment, _), seqs)| SharedSegment { seqs, segment })
        .collect();
    plan.sort_by(|a, b| (a.segment, &a.seqs).cmp(&(b.segment, &b.seqs)));
    plan
    // END SOLUTION
}

/// What the planner found so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CascadeStats {
    /// Steps that had at least one shared segment.
    pub steps: u64,
    /// (sequence, shared segment) pairs attended as part of a group.
    pub shared_reads: u64,
    /// Tokens of shared segments read once per group instead of once per sequence.
    pub tokens_saved: u64,
}

/// A runner that adds a cascade plan to every step it forwards.
pub struct CascadeRunner<R> {
    inner: R,
    stats: Arc<Mutex<CascadeStats>>,
}

impl<R: ModelRunner> CascadeRunner<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            stats: Arc::default(),
        }
    }

    /// A handle on the counters that stays readable once the runner is inside an engine.
    pub fn stats_handle(&self) -> Arc<Mutex<CascadeStats>> {
        Arc::clone(&self.stats)
    }

    fn with_plan<T>(
        &mut self,
        batch: &ForwardBatch,
        run: impl FnOnce(&mut R, &ForwardBatch) -> T,
    ) -> T {
        if !batch.shared.is_empty() || batch.seqs.iter().all(|s| s.kv.len() < 2) {
            return run(&mut self.inner, batch);
        }
        let plan = plan_cascade(batch);
        if plan.is_empty() {
            return run(&mut self.inner, batch);
        }
        {
            let mut stats = self.stats.lock().expect("stats lock");
            stats.steps += 1;
            for group in &plan {
                let n = group.seqs.len() as u64;
                stats.shared_reads += n;
                let tokens = batch.seqs[group.seqs[0]].kv[group.segment].num_tokens() as u64;
                stats.tokens_saved += (n - 1) * tokens;
            }
        }
        let planned = ForwardBatch {
            seqs: batch.seqs.clone(),
            shared: plan,
        };
        run(&mut self.inner, &planned)
    }
}

impl<R: ModelRunner> ModelRunner for CascadeRunner<R> {
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

    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        self.inner.copy_kv(src, dst, rope_shift)
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        self.with_plan(batch, |r, b| r.forward(b))
    }

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        self.with_plan(batch, |r, b| r.forward_sample(b))
    }

    fn can_overlap(&self) -> bool {
        self.inner.can_overlap()
    }

    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        self.with_plan(batch, |r, b| r.launch(b))
    }

    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        self.inner.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase2::ForwardSeq;

    fn seq(kv: Vec<BlockTable>) -> ForwardSeq {
        ForwardSeq {
            seq_id: 0,
            tokens: vec![1],
            start_pos: kv.iter().map(|t| t.num_tokens()).sum::<usize>() - 1,
            kv,
            sample: None,
        }
    }

    #[test]
    fn groups_identical_segments_at_the_same_level() {
        let sys = BlockTable::from_pages(vec![0, 1], 20);
        let ctx_a = BlockTable::from_pages(vec![2], 5);
        let ctx_b = BlockTable::from_pages(vec![3], 5);
        let own = |p| BlockTable::from_pages(vec![p], 1);
        let batch = ForwardBatch {
            seqs: vec![
                seq(vec![sys.clone(), ctx_a.clone(), own(10)]),
                seq(vec![sys.clone(), ctx_a.clone(), own(11)]),
                seq(vec![sys.clone(), ctx_b, own(12)]),
                seq(vec![own(13)]),
                seq(vec![sys, own(14)]),
            ],
            shared: vec![],
        };
        let plan = plan_cascade(&batch);
        assert_eq!(
            plan,
            vec![
                SharedSegment {
                    seqs: vec![0, 1, 2, 4],
                    segment: 0
                },
                SharedSegment {
                    seqs: vec![0, 1],
                    segment: 1
                },
            ]
        );
    }
}
