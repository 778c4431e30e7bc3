//! A forward step as the device will run it, worked out on the host: which row each token
//! occupies, where its K/V is stored, which pages each attention call reads, and how cascade
//! groups are gathered and merged back.
//!
//! Rows are reordered: sequences with one new token (decode) come first, in batch order, so
//! the decode kernel reads them as one contiguous block; prefill pieces follow. Every other
//! step of a layer works row by row and does not care about the order. Nothing here touches the
//! GPU, so this part of the runner is tested on any machine.

use kernels::sampling::SampleParams;
use phase0::TokenId;
use phase1::BlockTable;
use phase2::{BatchLimits, Error, ForwardBatch, validate_segments};
use phase6_chunks::SharedSegment;

use crate::overlap::PENDING_TOKEN;

/// What the runner can execute: a batch beyond these is refused, not attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub page_size: usize,
    pub num_pages: usize,
    pub vocab_size: usize,
    pub max_position: usize,
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub split: CascadeSplit,
}

impl Limits {
    fn batch(&self) -> BatchLimits {
        BatchLimits {
            page_size: self.page_size,
            num_pages: self.num_pages,
            vocab_size: self.vocab_size,
            max_position: self.max_position,
            max_seqs: self.max_seqs,
            max_tokens: self.max_tokens,
        }
    }
}

/// How finely a cascade group's shared segment is cut. The prefill kernel gives each block 64
/// (query, head) rows of one KV head, so a group of a few dozen decoding sequences makes only a
/// handful of blocks, each walking the whole prefix: a 32k-token prefix read by 16 blocks
/// leaves most of an H100 idle. Cut into pieces attended at once (each in its own level, merged
/// by log-sum-exp like the levels already are), it fills the GPU; FlashDecoding's split-K for
/// the shared half of cascade attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CascadeSplit {
    pub num_sms: usize,
    pub q_per_kv: usize,
    pub kv_heads: usize,
    /// No piece shorter than this many tokens.
    pub min_tokens: usize,
}

impl CascadeSplit {
    /// Pieces for `queries` query tokens over `tokens` shared tokens: enough blocks for two per
    /// multiprocessor, at most 8 pieces.
    fn pieces(&self, queries: usize, tokens: usize) -> usize {
        let blocks = (queries * self.q_per_kv).div_ceil(64) * self.kv_heads.max(1);
        (2 * self.num_sms)
            .div_ceil(blocks.max(1))
            .min(tokens / self.min_tokens.max(1))
            .clamp(1, 8)
    }
}

/// The page table of one attention call in the kernels' layout (`kernels::paged`): sequence
/// `s` reads entries `indptr[s]..indptr[s + 1]`, each a page id and its number of valid tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    pub indptr: Vec<i32>,
    pub page_ids: Vec<i32>,
    pub page_lens: Vec<i32>,
    /// Prefix sums of each sequence's slots, rounded up to 32: how the decode kernel shares
    /// the KV out among its blocks (`kernels::paged::slot_indptr`).
    pub slot_indptr: Vec<i32>,
}

impl Table {
    fn new() -> Self {
        Self {
            indptr: vec![0],
            page_ids: Vec::new(),
            page_lens: Vec::new(),
            slot_indptr: vec![0],
        }
    }

    /// Closes the sequence whose entries were just pushed, starting at entry `first`.
    fn end_seq(&mut self, first: usize, page_size: usize) {
        let slots = kernels::paged::seq_slots(&self.page_lens[first..], page_size);
        let before = *self.slot_indptr.last().expect("starts with 0");
        self.slot_indptr.push(before + slots as i32);
        self.indptr.push(self.page_ids.len() as i32);
    }

    /// Appends one sequence whose KV is `segments`, in order. A segment's last page may be
    /// partly filled; pages past its token count (reserved, not yet written) are left out.
    fn push_seq<'a>(
        &mut self,
        segments: impl IntoIterator<Item = &'a BlockTable>,
        page_size: usize,
    ) {
        let first = self.page_ids.len();
        for segment in segments {
            let n = segment.num_tokens();
            for (k, &page) in segment.pages()[..n.div_ceil(page_size)].iter().enumerate() {
                self.page_ids.push(page as i32);
                self.page_lens
                    .push((n - k * page_size).min(page_size) as i32);
            }
        }
        self.end_seq(first, page_size);
    }

    /// Appends one sequence that reads `pages` of `segment`, a range of its written pages.
    fn push_pages(
        &mut self,
        segment: &BlockTable,
        pages: std::ops::Range<usize>,
        page_size: usize,
    ) {
        let n = segment.num_tokens();
        let first = self.page_ids.len();
        for k in pages {
            let tokens = (n - k * page_size).min(page_size);
            self.page_ids.push(segment.pages()[k] as i32);
            self.page_lens.push(tokens as i32);
        }
        self.end_seq(first, page_size);
    }

    pub fn num_seqs(&self) -> usize {
        self.indptr.len() - 1
    }

    pub fn num_entries(&self) -> usize {
        self.page_ids.len()
    }
}

/// Queries for the prefill kernel: rows `q_indptr[s]..q_indptr[s + 1]` of its query block
/// attend to sequence `s` of `table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prefill {
    pub table: Table,
    pub q_indptr: Vec<i32>,
    pub max_q: usize,
}

impl Prefill {
    fn new() -> Self {
        Self {
            table: Table::new(),
            q_indptr: vec![0],
            max_q: 0,
        }
    }

    fn push(&mut self, num_queries: usize) {
        let last = *self.q_indptr.last().expect("starts with 0");
        self.q_indptr.push(last + num_queries as i32);
        self.max_q = self.max_q.max(num_queries);
    }
}

/// Cascade groups attended in one call: no token belongs to two of them, so their results
/// can be merged back into the main output at once. `rows` are the gathered token rows, group
/// after group; `groups` attends them (unmasked) to each group's shared segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Level {
    pub rows: Vec<u32>,
    pub groups: Prefill,
}

/// Everything one step uploads, in device row order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepPlan {
    pub ids: Vec<u32>,
    pub positions: Vec<i32>,
    /// (page, offset) of each row's new K/V; a negative page stores nothing (padding).
    pub slots: Vec<i32>,
    /// One-token sequences: rows `0..decode.num_seqs()`.
    pub decode: Table,
    /// The other sequences: the rows after the decode ones.
    pub prefill: Prefill,
    pub levels: Vec<Level>,
    /// The last row of each sampling sequence, in batch order (the lm_head's input rows).
    pub sample_rows: Vec<u32>,
    pub params: Vec<SampleParams>,
    /// Sequences that sample (`sample_rows` may be longer after padding).
    pub num_sampled: usize,
}

impl StepPlan {
    /// The plan of `batch`, whose sequences attend the segments of `shared` as cascade groups
    /// (a plan made by [`phase6_chunks::plan_cascade`]).
    pub fn new(
        batch: &ForwardBatch,
        shared: &[SharedSegment],
        limits: &Limits,
    ) -> Result<Self, Error> {
        validate(batch, limits)?;
        let ps = limits.page_size;
        // The segments each sequence reads through a cascade group rather than on its own.
        let mut read_shared: Vec<Vec<usize>> = vec![Vec::new(); batch.seqs.len()];
        for group in shared {
            for &i in &group.seqs {
                read_shared[i].push(group.segment);
            }
        }
        let (decode, prefill): (Vec<usize>, Vec<usize>) =
            (0..batch.seqs.len()).partition(|&i| batch.seqs[i].tokens.len() == 1);

        let num_tokens = batch.num_tokens();
        let mut plan = Self {
            ids: Vec::with_capacity(num_tokens),
            positions: Vec::with_capacity(num_tokens),
            slots: Vec::with_capacity(2 * num_tokens),
            decode: Table::new(),
            prefill: Prefill::new(),
            levels: Vec::new(),
            sample_rows: Vec::new(),
            params: Vec::new(),
            num_sampled: 0,
        };
        let mut first_row = vec![0; batch.seqs.len()];
        for &i in decode.iter().chain(&prefill) {
            let s = &batch.seqs[i];
            first_row[i] = plan.ids.len();
            let own = s.kv.last().expect("validated");
            let first_own = own.num_tokens() - s.tokens.len();
            for (j, &token) in s.tokens.iter().enumerate() {
                let slot = own.slot(first_own + j, ps);
                plan.ids.push(token);
                plan.positions.push((s.start_pos + j) as i32);
                plan.slots.extend([slot.page as i32, slot.offset as i32]);
            }
            let own_segments =
                s.kv.iter()
                    .enumerate()
                    .filter(|(k, _)| !read_shared[i].contains(k))
                    .map(|(_, t)| t);
            if s.tokens.len() == 1 {
                plan.decode.push_seq(own_segments, ps);
            } else {
                plan.prefill.table.push_seq(own_segments, ps);
                plan.prefill.push(s.tokens.len());
            }
        }

        // Cascade groups in levels: each group (or piece of a group's segment) goes to the
        // first level none of whose groups holds one of its sequences.
        let mut level_seqs: Vec<Vec<usize>> = Vec::new();
        for group in shared {
            let segment = &batch.seqs[group.seqs[0]].kv[group.segment];
            let queries: usize = group.seqs.iter().map(|&i| batch.seqs[i].tokens.len()).sum();
            let pages = segment.num_tokens().div_ceil(ps);
            let pieces = limits
                .split
                .pieces(queries, segment.num_tokens())
                .min(pages.max(1));
            let per_piece = pages.div_ceil(pieces);
            for first_page in (0..pages).step_by(per_piece.max(1)) {
                let at = level_seqs
                    .iter()
                    .position(|taken| group.seqs.iter().all(|i| !taken.contains(i)))
                    .unwrap_or_else(|| {
                        level_seqs.push(Vec::new());
                        plan.levels.push(Level {
                            rows: Vec::new(),
                            groups: Prefill::new(),
                        });
                        level_seqs.len() - 1
                    });
                level_seqs[at].extend(&group.seqs);
                let level = &mut plan.levels[at];
                for &i in &group.seqs {
                    let n = batch.seqs[i].tokens.len();
                    level
                        .rows
                        .extend((first_row[i]..first_row[i] + n).map(|r| r as u32));
                }
                let range = first_page..(first_page + per_piece).min(pages);
                level.groups.table.push_pages(segment, range, ps);
                level.groups.push(queries);
            }
        }

        for (i, s) in batch.seqs.iter().enumerate() {
            if let Some(spec) = s.sample {
                plan.sample_rows
                    .push((first_row[i] + s.tokens.len() - 1) as u32);
                plan.params.push(SampleParams::new(
                    spec.temperature,
                    spec.top_k,
                    spec.top_p,
                    spec.seed,
                    spec.step,
                ));
            }
        }
        plan.num_sampled = plan.sample_rows.len();
        Ok(plan)
    }

    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Only one-token sequences and no cascade: the shape a captured decode graph runs.
    pub fn is_flat_decode(&self) -> bool {
        self.decode.num_seqs() > 0 && self.prefill.table.num_seqs() == 0 && self.levels.is_empty()
    }

    /// Pads a flat decode step to `bucket` sequences: padding rows read token 0 at position 0,
    /// store no K/V, attend to nothing, and feed the lm_head row 0 with greedy parameters.
    /// Their results are computed and ignored.
    pub fn pad_decode(&mut self, bucket: usize) {
        let extra = bucket.saturating_sub(self.decode.num_seqs());
        let last = *self.decode.indptr.last().expect("starts with 0");
        self.ids.extend(std::iter::repeat_n(0, extra));
        self.positions.extend(std::iter::repeat_n(0, extra));
        for _ in 0..extra {
            self.slots.extend([-1, 0]);
        }
        self.decode.indptr.extend(std::iter::repeat_n(last, extra));
        let slots = *self.decode.slot_indptr.last().expect("starts with 0");
        self.decode
            .slot_indptr
            .extend(std::iter::repeat_n(slots, extra));
        let rows = bucket.saturating_sub(self.sample_rows.len());
        self.sample_rows.extend(std::iter::repeat_n(0, rows));
        self.params
            .extend(std::iter::repeat_n(SampleParams::greedy(), rows));
    }
}

/// Checks everything the kernels rely on, so that a bad batch is an error and never an
/// out-of-bounds access on the device: chapter 2's checks, with one exception for the inputs
/// of a decode launched behind the step before it, which that step samples on the device.
fn validate(batch: &ForwardBatch, limits: &Limits) -> Result<(), Error> {
    validate_segments(batch, &limits.batch())?;
    for s in &batch.seqs {
        let pending = |t: TokenId| t == PENDING_TOKEN && s.tokens.len() == 1;
        if let Some(&t) = s
            .tokens
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size && !pending(t))
        {
            return Err(Error::InvalidBatch(format!(
                "sequence {}: token {t} is outside the vocabulary of {}",
                s.seq_id, limits.vocab_size
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use phase2::{ForwardSeq, SampleSpec};
    use phase6_chunks::plan_cascade;

    use super::*;

    /// The plan of a batch with the cascade groups the chunk runner would find.
    fn plan_of(batch: &ForwardBatch, limits: &Limits) -> Result<StepPlan, Error> {
        StepPlan::new(batch, &plan_cascade(batch), limits)
    }

    const LIMITS: Limits = Limits {
        page_size: 16,
        num_pages: 64,
        vocab_size: 100,
        max_position: 512,
        max_tokens: 256,
        max_seqs: 8,
        split: CascadeSplit {
            num_sms: 132,
            q_per_kv: 2,
            kv_heads: 8,
            min_tokens: 1024,
        },
    };

    fn seq(id: u64, tokens: usize, kv: Vec<BlockTable>, sample: bool) -> ForwardSeq {
        let total: usize = kv.iter().map(BlockTable::num_tokens).sum();
        ForwardSeq {
            seq_id: id,
            tokens: (0..tokens as u32).map(|t| t + 1).collect(),
            start_pos: total - tokens,
            kv,
            sample: sample.then(SampleSpec::greedy),
        }
    }

    #[test]
    fn decode_rows_come_first_and_slots_follow_the_own_segment() {
        let batch = ForwardBatch {
            seqs: vec![
                seq(0, 3, vec![BlockTable::from_pages(vec![4, 5], 20)], true),
                seq(1, 1, vec![BlockTable::from_pages(vec![9], 7)], true),
                seq(2, 2, vec![BlockTable::from_pages(vec![1, 2], 17)], false),
            ],
        };
        let plan = plan_of(&batch, &LIMITS).unwrap();
        // Row order: seq 1 (decode), then seq 0 and seq 2.
        assert_eq!(plan.ids, vec![1, 1, 2, 3, 1, 2]);
        assert_eq!(plan.positions, vec![6, 17, 18, 19, 15, 16]);
        assert_eq!(plan.slots, vec![9, 6, 5, 1, 5, 2, 5, 3, 1, 15, 2, 0]);
        assert_eq!(plan.decode.indptr, vec![0, 1]);
        assert_eq!(
            (plan.decode.page_ids.clone(), plan.decode.page_lens.clone()),
            (vec![9], vec![7])
        );
        assert_eq!(plan.prefill.q_indptr, vec![0, 3, 5]);
        assert_eq!(plan.prefill.table.indptr, vec![0, 2, 4]);
        assert_eq!(plan.prefill.table.page_lens, vec![16, 4, 16, 1]);
        assert_eq!(plan.prefill.max_q, 3);
        // Slots up to the last valid one, rounded up to 32 (7 and 20 -> 32).
        assert_eq!(plan.decode.slot_indptr, vec![0, 32]);
        assert_eq!(plan.prefill.table.slot_indptr, vec![0, 32, 64]);
        // Sampled rows in batch order: seq 0's last token (row 3), then seq 1 (row 0).
        assert_eq!(plan.sample_rows, vec![3, 0]);
        assert_eq!(plan.num_sampled, 2);
        assert!(!plan.is_flat_decode());
    }

    #[test]
    fn cascade_groups_leave_their_segment_out_of_each_own_table() {
        let prefix = BlockTable::from_pages(vec![10, 11, 12], 37);
        let batch = ForwardBatch {
            seqs: vec![
                seq(
                    0,
                    5,
                    vec![prefix.clone(), BlockTable::from_pages(vec![20], 5)],
                    true,
                ),
                seq(
                    1,
                    1,
                    vec![prefix.clone(), BlockTable::from_pages(vec![21], 3)],
                    true,
                ),
                seq(2, 1, vec![BlockTable::from_pages(vec![30], 4)], true),
            ],
        };
        let plan = plan_of(&batch, &LIMITS).unwrap();
        // Rows: seq 1 (0), seq 2 (1), seq 0 (2..7).
        assert_eq!(plan.decode.page_ids, vec![21, 30]);
        assert_eq!(plan.prefill.table.page_ids, vec![20]);
        assert_eq!(plan.levels.len(), 1);
        let level = &plan.levels[0];
        assert_eq!(level.rows, vec![2, 3, 4, 5, 6, 0]);
        assert_eq!(level.groups.q_indptr, vec![0, 6]);
        assert_eq!(level.groups.table.page_lens, vec![16, 16, 5]);
    }

    #[test]
    fn a_long_shared_prefix_with_few_queries_is_cut_into_pieces_on_separate_levels() {
        // 5 pages of 16 (the last holding 8 tokens); pieces of at least 32 tokens.
        let prefix = BlockTable::from_pages(vec![10, 11, 12, 13, 14], 72);
        let own = |p: u32| BlockTable::from_pages(vec![p], 1);
        let batch = ForwardBatch {
            seqs: vec![
                seq(0, 1, vec![prefix.clone(), own(5)], true),
                seq(1, 1, vec![prefix.clone(), own(6)], true),
            ],
        };
        let limits = Limits {
            split: CascadeSplit {
                min_tokens: 32,
                ..LIMITS.split
            },
            ..LIMITS
        };
        let plan = plan_of(&batch, &limits).unwrap();
        // 72 tokens / 32 = 2 pieces of 3 and 2 pages; each on its own level, both rows in each.
        assert_eq!(plan.levels.len(), 2);
        let pages: Vec<_> = plan
            .levels
            .iter()
            .map(|l| l.groups.table.page_ids.clone())
            .collect();
        assert_eq!(pages, vec![vec![10, 11, 12], vec![13, 14]]);
        let lens: Vec<_> = plan
            .levels
            .iter()
            .map(|l| l.groups.table.page_lens.clone())
            .collect();
        assert_eq!(lens, vec![vec![16, 16, 16], vec![16, 8]]);
        assert!(plan.levels.iter().all(|l| l.rows == vec![0, 1]));
        assert!(plan.levels.iter().all(|l| l.groups.q_indptr == vec![0, 2]));
        // With the default piece length, the same group stays whole.
        let whole = plan_of(&batch, &LIMITS).unwrap();
        assert_eq!(whole.levels.len(), 1);
        assert_eq!(
            whole.levels[0].groups.table.page_ids,
            vec![10, 11, 12, 13, 14]
        );
    }

    #[test]
    fn a_sequence_in_two_groups_lands_in_two_levels() {
        let system = BlockTable::from_pages(vec![1], 10);
        let doc = BlockTable::from_pages(vec![2, 3], 20);
        let own = |p: u32| BlockTable::from_pages(vec![p], 1);
        let batch = ForwardBatch {
            seqs: vec![
                seq(0, 1, vec![system.clone(), doc.clone(), own(5)], true),
                seq(1, 1, vec![system.clone(), doc.clone(), own(6)], true),
                seq(2, 1, vec![system.clone(), own(7)], true),
            ],
        };
        let plan = plan_of(&batch, &LIMITS).unwrap();
        assert_eq!(plan.levels.len(), 2);
        assert_eq!(plan.levels[0].rows, vec![0, 1, 2]);
        assert_eq!(plan.levels[1].rows, vec![0, 1]);
        assert_eq!(plan.decode.page_ids, vec![5, 6, 7]);
        assert!(!plan.is_flat_decode());
    }

    #[test]
    fn padding_a_decode_step_stores_nothing_and_reads_nothing() {
        let batch = ForwardBatch {
            seqs: vec![seq(0, 1, vec![BlockTable::from_pages(vec![3], 2)], true)],
        };
        let mut plan = plan_of(&batch, &LIMITS).unwrap();
        assert!(plan.is_flat_decode());
        plan.pad_decode(4);
        assert_eq!(plan.ids.len(), 4);
        assert_eq!(&plan.slots[2..], &[-1, 0, -1, 0, -1, 0]);
        assert_eq!(plan.decode.indptr, vec![0, 1, 1, 1, 1]);
        assert_eq!(plan.decode.slot_indptr, vec![0, 32, 32, 32, 32]);
        assert_eq!(plan.sample_rows, vec![0, 0, 0, 0]);
        assert_eq!((plan.params.len(), plan.num_sampled), (4, 1));
    }

    #[test]
    fn bad_batches_are_errors() {
        let ok = || seq(0, 2, vec![BlockTable::from_pages(vec![1], 2)], true);
        let mut cases = Vec::new();
        let mut s = ok();
        s.tokens[0] = 100;
        cases.push((vec![s], "vocabulary"));
        let mut s = ok();
        s.kv = vec![BlockTable::from_pages(vec![64], 2)];
        cases.push((vec![s], "outside the store"));
        let mut s = ok();
        s.start_pos = 1;
        cases.push((vec![s], "segments hold"));
        cases.push((vec![ok(); 9], "sized for 8"));
        for (seqs, needle) in cases {
            let err = plan_of(&ForwardBatch { seqs }, &LIMITS).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidBatch(m) if m.contains(needle)),
                "{err} (wanted {needle})"
            );
        }
    }
}
