//! Cascade planning: finding the KV segments that several sequences of a step share.
//!
//! Requests composed from the same registered chunks read the same pages: a system prompt
//! shared by a whole batch, contexts shared by some. FlashInfer's cascade attention attends
//! such a shared segment once for all the queries that read it and merges the partial result
//! into each query's attention by log-sum-exp; for a long shared prefix that turns many reads
//! of the same K/V into one. A [`crate::ChunkRunner`] plans each step it runs with
//! [`plan_cascade`] and counts what it found in [`CascadeStats`].

use std::collections::HashMap;

use phase1::BlockTable;
use phase2::ForwardBatch;

/// Several sequences attending to the same KV segment: the runner reads that segment once for
/// all their queries and merges the partial result with the rest of each sequence's attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSegment {
    /// Indices into [`ForwardBatch::seqs`]; each has the same pages as its `kv[segment]`.
    pub seqs: Vec<usize>,
    /// Which segment of those sequences is shared (never their own, last one).
    pub segment: usize,
}

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

impl CascadeStats {
    /// Counts one step's plan.
    pub fn record(&mut self, batch: &ForwardBatch, plan: &[SharedSegment]) {
        if plan.is_empty() {
            return;
        }
        self.steps += 1;
        for group in plan {
            let n = group.seqs.len() as u64;
            self.shared_reads += n;
            let tokens = batch.seqs[group.seqs[0]].kv[group.segment].num_tokens() as u64;
            self.tokens_saved += (n - 1) * tokens;
        }
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
