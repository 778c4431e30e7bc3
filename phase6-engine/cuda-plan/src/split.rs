//! Split-KV: KV that a few queries attend without the causal mask, cut into pieces attended at
//! once and merged back by log-sum-exp (FlashDecoding's split for the prefill kernel).
//!
//! The prefill kernel gives each block 128 (query, head) rows of one sequence and one KV head
//! on Hopper (64 with `mma.sync`). Few queries over a long KV make only a handful of blocks,
//! each walking all of it one tile after the other: a 16-token query after a 16k-token cached
//! context is 8 blocks on a GPU of 132 multiprocessors, and its attention, not its matrix products, is most
//! of the step. Such KV comes in two kinds, both seen whole by every query reading it: a
//! cascade group's shared segment, and the part of a sequence's own KV that ends before its
//! first new token (a registered context, a cached prefix, earlier chunks of a chunked
//! prefill). Each is cut into pieces by page entries; one unmasked prefill call attends every
//! piece of a level, every piece reading the same copy of the queries, and
//! `kernels::merge::merge_pieces_into` folds the pieces into the causal part in one launch.

use std::ops::Range;

use crate::plan::{Level, Prefill};

/// The most pieces one level is cut into: more were slower in every case measured.
pub const MAX_PIECES: usize = 32;

/// Pieces at least this long fill the wave even beside the decode rows
/// ([`KvSplit::pieces_beside`]).
pub const BESIDE_WHOLE_WAVE_TOKENS: usize = 2048;

/// How finely unmasked KV is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSplit {
    /// The prefill kernel's rows (query, head) a block, and the blocks that fill the GPU once
    /// (`kernels::prefill::PrefillKernel::wave`).
    pub block_rows: usize,
    pub blocks_at_once: usize,
    pub q_per_kv: usize,
    pub kv_heads: usize,
    /// No piece shorter than this many tokens: a piece's blocks pay for loading their queries,
    /// writing a partial result and its share of the merges.
    pub min_tokens: usize,
    /// Whether a step's decode rows run beside its first level's call: the prefill kernel lets
    /// a kernel launched after it start before it ends
    /// (`kernels::prefill::PrefillKernel::lets_dependents_start`).
    pub decode_beside: bool,
    /// The grid of the decode that folds a first level's pieces into its rows
    /// (`kernels::decode::folding_blocks`), where the runner folds; `None` where it never does.
    pub fold_blocks: Option<usize>,
}

impl KvSplit {
    /// Pieces for `queries` query tokens over `tokens` unmasked tokens: as many as one wave of
    /// the prefill kernel's blocks holds, no piece under `min_tokens`, at most [`MAX_PIECES`];
    /// a power of two (the counts `cargo bench -p kernels --bench cascade` measures). KV of
    /// less than three pieces' worth stays whole: the pieces' partial results and their merge,
    /// one more launch, which a short one pass does not pay back.
    pub fn pieces(&self, queries: usize, tokens: usize) -> usize {
        let min_tokens = self.min_tokens.max(1);
        if tokens / 3 < min_tokens {
            return 1;
        }
        let rows = self.block_rows.max(1);
        let blocks = (queries * self.q_per_kv).div_ceil(rows) * self.kv_heads.max(1);
        let wanted = self
            .blocks_at_once
            .div_ceil(blocks.max(1))
            .min(tokens / min_tokens)
            .clamp(1, MAX_PIECES);
        floor_power_of_two(wanted)
    }

    /// Whether the step's decode, over a table of these slot prefix sums, folds a first
    /// level's pieces into its rows (`kernels::decode::folds` on [`Self::fold_blocks`]).
    pub fn decode_folds(&self, decode_slots: &[i32]) -> bool {
        self.fold_blocks.is_some_and(|blocks| {
            let heads = self.q_per_kv * self.kv_heads;
            kernels::decode::folds(decode_slots, heads, self.q_per_kv, blocks)
        })
    }

    /// [`Self::pieces`] for the level that the step's decode rows are attended beside, unless
    /// their decode folds that level's pieces in (see [`Level::folded`]; the level then fills
    /// the wave). Where [`Self::decode_beside`] (the CUDA runner starts their decode while
    /// the level's call runs, on the multiprocessors it leaves free) and filling the wave would
    /// cut pieces shorter than [`BESIDE_WHOLE_WAVE_TOKENS`], half the wave, the other half left
    /// to the decode; otherwise [`Self::pieces`]. On an H100 (`cargo bench -p kernels --bench
    /// cascade`: 64-256 requests, 4k-32k shared tokens), in a build whose decode did not fold,
    /// this was the fastest count on 8 of the 12 cases and 5-8% from it on the other four (4k
    /// tokens, and 256 x 8k); filling the wave was 6-21% slower on six of them in an earlier
    /// build.
    pub fn pieces_beside(&self, queries: usize, tokens: usize) -> usize {
        let whole_wave = self.pieces(queries, tokens);
        if !self.decode_beside || whole_wave == 1 || tokens / whole_wave >= BESIDE_WHOLE_WAVE_TOKENS
        {
            return whole_wave;
        }
        let half = KvSplit {
            blocks_at_once: (self.blocks_at_once / 2).max(1),
            ..*self
        };
        half.pieces(queries, tokens)
    }
}

fn floor_power_of_two(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.max(1).leading_zeros())
}

/// Page entries `(page id, valid tokens)` that the query rows of `seqs` attend unmasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unmasked {
    /// Indices into the batch.
    pub seqs: Vec<usize>,
    pub entries: Vec<(i32, i32)>,
    /// Query tokens of all of `seqs`.
    pub queries: usize,
}

impl Unmasked {
    fn tokens(&self) -> usize {
        self.entries.iter().map(|&(_, n)| n as usize).sum()
    }
}

/// How many leading `entries` of a prefill sequence's own KV to attend apart, in pieces: those
/// that end before its first new token (every one of its `queries` sees them whole), when they
/// are long enough to be cut; 0 otherwise.
pub(crate) fn visible_head(entries: &[(i32, i32)], queries: usize, split: &KvSplit) -> usize {
    let total: usize = entries.iter().map(|&(_, n)| n as usize).sum();
    let before = total.saturating_sub(queries);
    let (mut head, mut tokens) = (0, 0);
    for &(_, n) in entries {
        if tokens + n as usize > before {
            break;
        }
        tokens += n as usize;
        head += 1;
    }
    if split.pieces(queries, tokens) > 1 {
        head
    } else {
        0
    }
}

/// Puts each unmasked part on the first level that holds none of its sequences (a level's
/// rows must be distinct to be merged back in place), and cuts the parts of a level into as
/// many pieces as its most demanding part wants, as far as `max_rows` rows of the pieces'
/// outputs allow; the first level for the step's decode rows beside it where the step has some
/// (the step's first rows, one a sequence of `decode_slots`, their table's slot prefix sums)
/// and the split runs them so. Where the first level's rows are those decode rows, in order,
/// and their decode can fold the level's pieces into its own rows ([`KvSplit::decode_folds`], on
/// any GPU), the level is [`Level::folded`] and fills the wave.
/// Piece `p` of part `g` is sequence `p * parts + g` of the level's call; `rows_of(i)` are the
/// step's rows of batch sequence `i`.
pub(crate) fn levels(
    parts: Vec<Unmasked>,
    rows_of: impl Fn(usize) -> Range<usize>,
    split: &KvSplit,
    page_size: usize,
    max_rows: usize,
    decode_slots: &[i32],
) -> Vec<Level> {
    let decode_rows = decode_slots.len().saturating_sub(1);
    let folds = split.decode_folds(decode_slots);
    let mut assigned: Vec<Vec<Unmasked>> = Vec::new();
    for part in parts {
        let free = |level: &Vec<Unmasked>| {
            level
                .iter()
                .all(|other| other.seqs.iter().all(|i| !part.seqs.contains(i)))
        };
        match assigned.iter().position(free) {
            Some(at) => assigned[at].push(part),
            None => assigned.push(vec![part]),
        }
    }
    assigned
        .into_iter()
        .enumerate()
        .map(|(level, parts)| {
            let rows: Vec<u32> = parts
                .iter()
                .flat_map(|p| p.seqs.iter().flat_map(|&i| rows_of(i)))
                .map(|r| r as u32)
                .collect();
            let folded = level == 0 && folds && rows.iter().copied().eq(0..decode_rows as u32);
            let beside = decode_rows > 0 && level == 0 && !folded;
            let wanted = parts
                .iter()
                .map(|p| {
                    if beside {
                        split.pieces_beside(p.queries, p.tokens())
                    } else {
                        split.pieces(p.queries, p.tokens())
                    }
                })
                .max()
                .unwrap_or(1);
            let pieces = wanted.min(floor_power_of_two(max_rows / rows.len().max(1)));
            let mut groups = Prefill::new();
            for k in 0..pieces {
                for part in &parts {
                    let e = part.entries.len();
                    let piece = &part.entries[k * e / pieces..(k + 1) * e / pieces];
                    groups.table.push_entries(piece, page_size);
                    groups.push(part.queries);
                }
            }
            Level {
                rows,
                pieces,
                groups,
                folded,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `mma.sync` kernel's wave on a GPU of 132 multiprocessors.
    const SPLIT: KvSplit = KvSplit {
        block_rows: 64,
        blocks_at_once: 264,
        q_per_kv: 2,
        kv_heads: 8,
        min_tokens: 256,
        decode_beside: false,
        fold_blocks: None,
    };

    #[test]
    fn pieces_fill_the_gpu_in_powers_of_two_and_stop_at_the_shortest_piece() {
        // 16 queries: 8 blocks a piece; two blocks per SM would be 33 pieces.
        assert_eq!(SPLIT.pieces(16, 16_040), 32);
        assert_eq!(SPLIT.pieces(16, 4_056), 8); // 15 pieces of 256 -> 8
        assert_eq!(SPLIT.pieces(16, 1_040), 4);
        // Under three pieces' worth: whole.
        assert_eq!(SPLIT.pieces(16, 767), 1);
        assert_eq!(SPLIT.pieces(16, 768), 2);
        assert_eq!(SPLIT.pieces(16, usize::MAX), 32);
        let whole = KvSplit {
            min_tokens: usize::MAX,
            ..SPLIT
        };
        assert_eq!(whole.pieces(16, usize::MAX), 1);
        // The Hopper kernel's wave: 128 rows a block, one block a multiprocessor. 16 queries
        // are 8 blocks: 16 pieces fill 128 of the 132 multiprocessors.
        let hopper = KvSplit {
            block_rows: 128,
            blocks_at_once: 132,
            min_tokens: 128,
            ..SPLIT
        };
        assert_eq!(hopper.pieces(16, 16_040), 16);
        assert_eq!(hopper.pieces(16, 1_040), 8);
        assert_eq!(hopper.pieces(128, 4_096), 8);
        assert_eq!(hopper.pieces(256, 4_096), 4);
        // 512 queries already make 128 blocks: two pieces.
        assert_eq!(SPLIT.pieces(512, 16_000), 2);
        assert_eq!(SPLIT.pieces(4096, 16_000), 1);
        assert_eq!(floor_power_of_two(1), 1);
        assert_eq!(floor_power_of_two(33), 32);
    }

    /// The cascade bench's twelve cases on the Hopper kernel's wave, with the runner's pieces
    /// of at least 384 tokens: half the wave while the pieces would be short.
    #[test]
    fn beside_the_decode_short_pieces_fill_half_the_wave() {
        let hopper = KvSplit {
            block_rows: 128,
            blocks_at_once: 132,
            min_tokens: 384,
            decode_beside: true,
            ..SPLIT
        };
        let want = [
            (64, [8, 8, 8, 16]),
            (128, [4, 4, 8, 8]),
            (256, [2, 4, 4, 4]),
        ];
        for (requests, counts) in want {
            for (k, count) in counts.into_iter().enumerate() {
                let tokens = 4096 << k;
                assert_eq!(
                    hopper.pieces_beside(requests, tokens),
                    count,
                    "{requests} requests x {tokens} tokens"
                );
            }
        }
        // Filling the wave: 16 parts at 64 requests, 8 at 128, 4 at 256.
        assert_eq!(hopper.pieces(64, 8192), 16);
        assert_eq!(hopper.pieces(128, 4096), 8);
        assert_eq!(hopper.pieces(256, 4096), 4);
        // Too short to cut stays whole; with no decode beside, the whole wave.
        assert_eq!(hopper.pieces_beside(64, 1000), 1);
        let alone = KvSplit {
            decode_beside: false,
            ..hopper
        };
        assert_eq!(alone.pieces_beside(64, 8192), 16);
    }

    #[test]
    fn the_visible_head_ends_before_the_first_new_token() {
        let split = KvSplit {
            min_tokens: 16,
            ..SPLIT
        };
        // 100 tokens of which the last 10 are new: entries of 16 up to token 80 are whole
        // before token 90; the entry holding tokens 80..96 is not.
        let own: Vec<(i32, i32)> = [16, 16, 16, 16, 16, 16, 4]
            .iter()
            .enumerate()
            .map(|(p, &n)| (p as i32, n))
            .collect();
        assert_eq!(visible_head(&own, 10, &split), 5);
        // Too short to cut (80 tokens, under three pieces of 64), or nothing before the queries.
        let coarse = KvSplit {
            min_tokens: 64,
            ..SPLIT
        };
        assert_eq!(visible_head(&own, 10, &coarse), 0);
        assert_eq!(visible_head(&own, 100, &split), 0);
    }
}
