//! A forward step as the device will run it, worked out on the host: which row each token
//! occupies, where its K/V is stored, which pages each attention call reads, and which KV is
//! attended without the causal mask in levels (cascade groups, long visible prefixes), gathered,
//! cut into pieces and merged back.
//!
//! Rows are reordered: sequences with one new token (decode) come first, in batch order, so
//! the decode kernel reads them as one contiguous block; prefill pieces follow. Every other
//! step of a layer works row by row and does not care about the order.

use kernels::sampling::SampleParams;
use phase0::TokenId;
use phase1::BlockTable;
use phase2::{BatchLimits, Error, ForwardBatch, validate_segments};
use phase6_chunks::SharedSegment;

use crate::PENDING_TOKEN;
use crate::split::{self, KvSplit, Unmasked};

/// What the runner can execute: a batch beyond these is refused, not attempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub page_size: usize,
    pub num_pages: usize,
    pub vocab_size: usize,
    pub max_position: usize,
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub split: KvSplit,
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

/// The page table of one attention call in the kernels' layout (`kernels::paged`): sequence
/// `s` reads entries `indptr[s]..indptr[s + 1]`, each a page id and its number of valid tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
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

    /// Appends one sequence that reads `entries`, `(page id, valid tokens)` in KV order.
    pub(crate) fn push_entries(&mut self, entries: &[(i32, i32)], page_size: usize) {
        for &(page, len) in entries {
            self.page_ids.push(page);
            self.page_lens.push(len);
        }
        let slots = kernels::paged::seq_slots(
            &self.page_lens[self.page_lens.len() - entries.len()..],
            page_size,
        );
        let before = *self.slot_indptr.last().expect("starts with 0");
        self.slot_indptr.push(before + slots as i32);
        self.indptr.push(self.page_ids.len() as i32);
    }

    pub fn num_seqs(&self) -> usize {
        self.indptr.len() - 1
    }

    pub fn num_entries(&self) -> usize {
        self.page_ids.len()
    }
}

/// The page entries of `segments`, in order: a segment's last page may be partly filled; pages
/// past its token count (reserved, not yet written) are left out.
fn entries<'a>(
    segments: impl IntoIterator<Item = &'a BlockTable>,
    page_size: usize,
) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    for segment in segments {
        let n = segment.num_tokens();
        for (k, &page) in segment.pages()[..n.div_ceil(page_size)].iter().enumerate() {
            out.push((page as i32, (n - k * page_size).min(page_size) as i32));
        }
    }
    out
}

/// Queries for the prefill kernel: rows `q_indptr[s]..q_indptr[s + 1]` of its query block
/// attend to sequence `s` of `table`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefill {
    pub table: Table,
    pub q_indptr: Vec<i32>,
    pub max_q: usize,
}

impl Prefill {
    pub(crate) fn new() -> Self {
        Self {
            table: Table::new(),
            q_indptr: vec![0],
            max_q: 0,
        }
    }

    pub(crate) fn push(&mut self, num_queries: usize) {
        let last = *self.q_indptr.last().expect("starts with 0");
        self.q_indptr.push(last + num_queries as i32);
        self.max_q = self.max_q.max(num_queries);
    }
}

/// Unmasked KV attended in one call: no query row belongs to two of its parts, so their results
/// can be merged back into the main output at once. Each part (a cascade group's shared segment,
/// or the visible head of one sequence's own KV) is cut into `pieces` ([`crate::split`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    /// The level's distinct query rows, part after part: the queries every piece reads, in
    /// place where they are one run of the step's rows ([`Self::in_place`]), else gathered
    /// once.
    pub rows: Vec<u32>,
    /// A power of two (`KvSplit::pieces`).
    pub pieces: usize,
    /// Sequence `p * parts + g` of this call is piece `p` of part `g`, over the rows of part
    /// `g` in the `p`-th copy of `rows`: its outputs are rows `p x rows.len()..` of the call,
    /// its queries the same rows of one copy.
    pub groups: Prefill,
    /// Whether the step's decode folds this level's pieces into its rows, no merge after it
    /// (`kernels::decode::decode_attention_folding`): the first level, whose rows are the decode
    /// rows, where their own slots lie whole in the folding kernel's ranges
    /// (`kernels::decode::folds`).
    pub folded: bool,
}

impl Level {
    /// The step's first row of `rows` where they are that row and the ones after it, in order
    /// (one cascade group of consecutive requests, one prefill's visible head): the call then
    /// reads the step's queries where they are.
    pub fn in_place(&self) -> Option<usize> {
        let first = *self.rows.first()?;
        let run = self.rows.iter().zip(first..).all(|(&r, want)| r == want);
        run.then_some(first as usize)
    }
}

/// Everything one step uploads, in device row order.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPlan {
    pub ids: Vec<u32>,
    pub positions: Vec<i32>,
    /// (page, offset) of each row's new K/V; a negative page stores nothing (padding).
    pub slots: Vec<i32>,
    /// One-token sequences: rows `0..decode.num_seqs()`.
    pub decode: Table,
    /// The other sequences: the rows after the decode ones, each over its own KV but the
    /// visible head a level attends.
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
        let mut unmasked: Vec<Unmasked> = shared
            .iter()
            .map(|group| Unmasked {
                seqs: group.seqs.clone(),
                entries: entries([&batch.seqs[group.seqs[0]].kv[group.segment]], ps),
                queries: group.seqs.iter().map(|&i| batch.seqs[i].tokens.len()).sum(),
            })
            .collect();
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
            let own_entries = entries(own_segments, ps);
            if s.tokens.len() == 1 {
                plan.decode.push_entries(&own_entries, ps);
            } else {
                let q = s.tokens.len();
                let head = split::visible_head(&own_entries, q, &limits.split);
                if head > 0 {
                    unmasked.push(Unmasked {
                        seqs: vec![i],
                        entries: own_entries[..head].to_vec(),
                        queries: q,
                    });
                }
                plan.prefill.table.push_entries(&own_entries[head..], ps);
                plan.prefill.push(q);
            }
        }
        let rows_of = |i: usize| first_row[i]..first_row[i] + batch.seqs[i].tokens.len();
        plan.levels = split::levels(
            unmasked,
            rows_of,
            &limits.split,
            ps,
            limits.max_tokens,
            &plan.decode.slot_indptr,
        );

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
        // A level may have been planned (and folded) over the decode rows as they were.
        debug_assert!(self.levels.is_empty(), "only a flat decode step is padded");
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
    use proptest::prelude::*;

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
        split: KvSplit {
            block_rows: 64,
            blocks_at_once: 264,
            q_per_kv: 2,
            kv_heads: 8,
            min_tokens: 1024,
            decode_beside: false,
            fold_blocks: None,
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
        // Not one run of the step's rows: the runner gathers them once.
        assert_eq!(level.in_place(), None);
        assert_eq!(level.groups.q_indptr, vec![0, 6]);
        assert_eq!(level.groups.table.page_lens, vec![16, 16, 5]);
    }

    /// [`LIMITS`] with pieces of at least `min_tokens`.
    fn cut_at(min_tokens: usize) -> Limits {
        Limits {
            split: KvSplit {
                min_tokens,
                ..LIMITS.split
            },
            ..LIMITS
        }
    }

    #[test]
    fn a_long_shared_prefix_with_few_queries_is_cut_into_pieces_of_one_level() {
        // 5 pages of 16 (the last holding 8 tokens); pieces of at least 24 tokens.
        let prefix = BlockTable::from_pages(vec![10, 11, 12, 13, 14], 72);
        let own = |p: u32| BlockTable::from_pages(vec![p], 1);
        let batch = ForwardBatch {
            seqs: vec![
                seq(0, 1, vec![prefix.clone(), own(5)], true),
                seq(1, 1, vec![prefix.clone(), own(6)], true),
            ],
        };
        let plan = plan_of(&batch, &cut_at(24)).unwrap();
        // 72 tokens / 24 = 3, down to a power of two: 2 pieces of 2 and 3 pages, attended in
        // one call: both rows once a piece, each piece one sequence of the call.
        assert_eq!(plan.levels.len(), 1);
        let level = &plan.levels[0];
        assert_eq!(level.pieces, 2);
        assert_eq!(level.rows, vec![0, 1]);
        assert_eq!(level.in_place(), Some(0));
        assert_eq!(level.groups.q_indptr, vec![0, 2, 4]);
        assert_eq!(level.groups.table.indptr, vec![0, 2, 5]);
        assert_eq!(level.groups.table.page_ids, vec![10, 11, 12, 13, 14]);
        assert_eq!(level.groups.table.page_lens, vec![16, 16, 16, 16, 8]);
        // With the default piece length, the same group stays whole.
        let whole = plan_of(&batch, &LIMITS).unwrap();
        assert_eq!(whole.levels.len(), 1);
        assert_eq!(whole.levels[0].pieces, 1);
        assert_eq!(whole.levels[0].rows, vec![0, 1]);
    }

    #[test]
    fn a_few_queries_after_a_long_context_attend_it_in_pieces_and_only_their_page_causally() {
        // The chunk API's cached composition: a system prompt (40 tokens) and a context (100)
        // read by one sequence alone, then its 3 new tokens on a page of their own.
        let system = BlockTable::from_pages(vec![1, 2, 3], 40);
        let context = BlockTable::from_pages((4..11).collect(), 100);
        let batch = ForwardBatch {
            seqs: vec![seq(
                0,
                3,
                vec![system, context, BlockTable::from_pages(vec![20], 3)],
                true,
            )],
        };
        let plan = plan_of(&batch, &cut_at(32)).unwrap();
        // The causal call reads only the new tokens' page.
        assert_eq!(plan.prefill.table.page_ids, vec![20]);
        assert_eq!(plan.prefill.table.page_lens, vec![3]);
        assert_eq!(plan.prefill.q_indptr, vec![0, 3]);
        // 140 visible tokens in 10 entries, cut into 4 pieces for the 3 rows.
        assert_eq!(plan.levels.len(), 1);
        let level = &plan.levels[0];
        assert_eq!(level.pieces, 4);
        assert_eq!(level.rows, vec![0, 1, 2]);
        assert_eq!(level.groups.q_indptr, vec![0, 3, 6, 9, 12]);
        assert_eq!(level.groups.table.indptr, vec![0, 2, 5, 7, 10]);
        assert_eq!(
            level.groups.table.page_ids,
            vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
        );
        // Pieces too short to pay: one causal call over everything, as before.
        let whole = plan_of(&batch, &LIMITS).unwrap();
        assert!(whole.levels.is_empty());
        assert_eq!(whole.prefill.table.num_entries(), 11);
    }

    #[test]
    fn a_chunked_prefill_attends_its_earlier_chunks_in_pieces() {
        // 100 tokens of its own, the last 10 new: entries up to token 80 end before token 90.
        let batch = ForwardBatch {
            seqs: vec![seq(
                0,
                10,
                vec![BlockTable::from_pages((30..37).collect(), 100)],
                true,
            )],
        };
        let plan = plan_of(&batch, &cut_at(24)).unwrap();
        assert_eq!(plan.prefill.table.page_ids, vec![35, 36]);
        assert_eq!(plan.prefill.table.page_lens, vec![16, 4]);
        let level = &plan.levels[0];
        assert_eq!(level.pieces, 2);
        assert_eq!(level.groups.table.page_ids, vec![30, 31, 32, 33, 34]);
        assert_eq!(level.rows, (0..10).collect::<Vec<u32>>());
        assert_eq!(level.in_place(), Some(0));
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

    /// Where the decode rows run beside the first level, that level is cut for half the wave
    /// (its pieces are short), unless its rows are the decode rows and their decode folds its
    /// pieces in; the second level, after the decode, still fills the wave.
    #[test]
    fn the_level_beside_the_decode_rows_is_cut_for_half_the_wave_unless_they_fold_it() {
        let system = BlockTable::from_pages((0..8).collect(), 128);
        let doc = BlockTable::from_pages((8..16).collect(), 128);
        let own =
            |p: u32, n: usize| BlockTable::from_pages((p..p + n.div_ceil(16) as u32).collect(), n);
        // Requests 0 and 1 share the system prompt and a document; request 2 shares the system
        // prompt (the first level's rows are every decode row) or nothing (they are not).
        let batch = |third_shares: bool, own_len: usize| ForwardBatch {
            seqs: vec![
                seq(
                    0,
                    1,
                    vec![system.clone(), doc.clone(), own(20, own_len)],
                    true,
                ),
                seq(
                    1,
                    1,
                    vec![system.clone(), doc.clone(), own(21, own_len)],
                    true,
                ),
                if third_shares {
                    seq(2, 1, vec![system.clone(), own(40, own_len)], true)
                } else {
                    seq(2, 1, vec![own(40, own_len)], true)
                },
            ],
        };
        // 8 blocks a piece (one 64-row block a KV head); a wave of 32 blocks: 4 pieces of 32
        // tokens, half the wave 2. A folding decode of 660 blocks takes ranges of 64 slots:
        // own pages of 1 token (32 slots) fold, of 65 (96 slots) do not.
        let split = |decode_beside, fold_blocks| Limits {
            split: KvSplit {
                blocks_at_once: 32,
                min_tokens: 16,
                decode_beside,
                fold_blocks,
                ..LIMITS.split
            },
            ..LIMITS
        };
        // Each level's pieces, and whether the decode folds it.
        let levels = |batch: &ForwardBatch, limits: &Limits| {
            let plan = plan_of(batch, limits).unwrap();
            let levels = plan.levels.iter();
            levels.map(|l| (l.pieces, l.folded)).collect::<Vec<_>>()
        };
        let folding = split(true, Some(660));
        let (folded, beside, after) = ((4, true), (2, false), (4, false));
        assert_eq!(levels(&batch(true, 1), &folding), vec![folded, after]);
        assert_eq!(levels(&batch(true, 65), &folding), vec![beside, after]);
        assert_eq!(levels(&batch(false, 1), &folding), vec![beside, after]);
        assert_eq!(
            levels(&batch(true, 1), &split(true, None)),
            vec![beside, after]
        );
        assert_eq!(
            levels(&batch(true, 1), &split(false, None)),
            vec![after, after]
        );
        // Without decode rows nothing runs beside: a prefill of two tokens sharing the system.
        let prefill = ForwardBatch {
            seqs: vec![
                seq(0, 2, vec![system.clone(), own(20, 2)], true),
                seq(1, 2, vec![system, own(30, 2)], true),
            ],
        };
        assert_eq!(levels(&prefill, &split(true, None)), vec![after]);
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

    /// The entries table `t` gives its sequence `j`.
    fn entries_of(t: &Table, j: usize) -> Vec<(i32, i32)> {
        (t.indptr[j] as usize..t.indptr[j + 1] as usize)
            .map(|e| (t.page_ids[e], t.page_lens[e]))
            .collect()
    }

    proptest! {
        /// Sequences behind 0-3 shared segments with 0-59 computed tokens of their own and
        /// 1-23 new ones: each reads every entry of its KV exactly once, in the causal call
        /// (a suffix of its KV, holding its new tokens) or in one piece of a level; a level's
        /// rows are distinct, each piece's lie in one copy of them, all pieces' outputs fit
        /// the step's rows, no level reads a slot the step stores (the CUDA runner starts
        /// a level's call before the store has ended), and a level is folded into the decode
        /// exactly where it is the first, its rows are the decode rows and their slots fold
        /// (half of the cases are decode steps alone, where that happens).
        #[test]
        fn every_sequence_reads_each_entry_of_its_kv_exactly_once(
            shared in proptest::collection::vec(1usize..120, 0..4),
            seqs in proptest::collection::vec((0usize..4, 0usize..60, 1usize..24), 1..7),
            min_tokens in prop_oneof![Just(16usize), Just(32), Just(1024)],
            fold_blocks in prop_oneof![Just(None), Just(Some(4usize)), Just(Some(660))],
            decode_only in any::<bool>(),
        ) {
            let ps = LIMITS.page_size;
            let mut next = 0u32;
            let mut alloc = |n: usize| {
                let pages: Vec<u32> = (next..next + n.div_ceil(ps) as u32).collect();
                next += pages.len() as u32;
                BlockTable::from_pages(pages, n)
            };
            let shared: Vec<BlockTable> = shared.iter().map(|&n| alloc(n)).collect();
            let seqs: Vec<ForwardSeq> = seqs
                .iter()
                .enumerate()
                .map(|(i, &(k, done, new))| {
                    let new = if decode_only { 1 } else { new };
                    let mut kv = shared[..k.min(shared.len())].to_vec();
                    kv.push(alloc(done + new));
                    seq(i as u64, new, kv, true)
                })
                .collect();
            let batch = ForwardBatch { seqs };
            let mut limits = Limits {
                num_pages: 1024,
                max_position: 4096,
                ..cut_at(min_tokens)
            };
            limits.split.fold_blocks = fold_blocks;
            let plan = plan_of(&batch, &limits).unwrap();

            let n = batch.seqs.len();
            let (decode, prefill): (Vec<usize>, Vec<usize>) =
                (0..n).partition(|&i| batch.seqs[i].tokens.len() == 1);
            let owner: Vec<usize> = decode
                .iter()
                .chain(&prefill)
                .flat_map(|&i| std::iter::repeat_n(i, batch.seqs[i].tokens.len()))
                .collect();
            let all: Vec<Vec<(i32, i32)>> =
                batch.seqs.iter().map(|s| entries(&s.kv, ps)).collect();
            let mut read: Vec<Vec<(i32, i32)>> = vec![Vec::new(); n];
            for (k, &i) in decode.iter().enumerate() {
                read[i].extend(entries_of(&plan.decode, k));
            }
            for (k, &i) in prefill.iter().enumerate() {
                let causal = entries_of(&plan.prefill.table, k);
                prop_assert!(all[i].ends_with(&causal), "sequence {i}: a suffix of its KV");
                let tokens: i32 = causal.iter().map(|e| e.1).sum();
                prop_assert!(tokens as usize >= batch.seqs[i].tokens.len());
                read[i].extend(causal);
            }
            let stored: std::collections::HashSet<(i32, i32)> = plan
                .slots
                .chunks(2)
                .map(|s| (s[0], s[1]))
                .filter(|&(page, _)| page >= 0)
                .collect();
            let slots_fold = limits.split.decode_folds(&plan.decode.slot_indptr);
            let decode_rows: Vec<u32> = (0..decode.len() as u32).collect();
            for (k, level) in plan.levels.iter().enumerate() {
                let folds = k == 0 && level.rows == decode_rows && slots_fold;
                prop_assert_eq!(level.folded, folds, "level {} folded", k);
                let t = &level.groups.table;
                for (&page, &len) in t.page_ids.iter().zip(&t.page_lens) {
                    for offset in 0..len {
                        prop_assert!(!stored.contains(&(page, offset)), "a level reads a new slot");
                    }
                }
                let d = level.rows.len();
                prop_assert!(level.pieces.is_power_of_two());
                prop_assert!(level.pieces * d <= limits.max_tokens);
                let mut distinct = level.rows.clone();
                distinct.sort();
                distinct.dedup();
                prop_assert_eq!(distinct.len(), d);
                if let Some(first) = level.in_place() {
                    let run: Vec<u32> = (first as u32..).take(d).collect();
                    prop_assert_eq!(&level.rows, &run);
                }
                let q = &level.groups.q_indptr;
                prop_assert_eq!(*q.last().unwrap() as usize, level.pieces * d);
                for j in 0..level.groups.table.num_seqs() {
                    // The kernel reads a piece's queries from one copy of the rows.
                    let (start, len) = (q[j] as usize % d, (q[j + 1] - q[j]) as usize);
                    prop_assert!(start + len <= d, "piece {j} runs past one copy");
                    let mut readers: Vec<usize> = level.rows[start..start + len]
                        .iter()
                        .map(|&r| owner[r as usize])
                        .collect();
                    readers.dedup();
                    for i in readers {
                        read[i].extend(entries_of(&level.groups.table, j));
                    }
                }
            }
            for i in 0..n {
                let (mut got, mut want) = (read[i].clone(), all[i].clone());
                got.sort();
                want.sort();
                prop_assert_eq!(got, want, "sequence {}", i);
            }
        }
    }
}
