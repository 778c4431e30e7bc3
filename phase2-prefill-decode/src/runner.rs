//! The seam between scheduling and math: what one forward step is asked to compute.
//!
//! Everything above this trait (pools, schedulers, caches, the engine) is backend-free; the
//! CPU runner of this chapter and the CUDA runner of chapter 6 sit below it and must give the
//! same tokens. A step is a list of sequences, each bringing some new tokens (a prefill piece
//! or one decode token) and the pages that hold its KV.

use phase0::{SamplingParams, SeqId, TokenId};
use phase1::{BlockTable, KvLayout};

use crate::error::Error;

/// How to pick the next token of one sequence, with its random stream fixed.
///
/// Randomness is a pure function of `(seed, step)`, so a sampled sequence gives the same tokens
/// whatever else shares its batch, and a preempted sequence resumes the same stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleSpec {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    /// The request's seed (chosen at random by the engine when the user gave none).
    pub seed: u64,
    /// Index of the token being sampled in the output (0 for the first).
    pub step: u64,
}

impl SampleSpec {
    pub fn new(params: &SamplingParams, seed: u64, step: u64) -> Self {
        Self {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            seed,
            step,
        }
    }

    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: -1,
            top_p: 1.0,
            seed: 0,
            step: 0,
        }
    }
}

/// One sequence's part of a forward step.
///
/// `kv` lists the sequence's KV as segments (see DESIGN.md): shared segments first (a cached
/// prefix, registered chunks), the sequence's own pages last. The caller has already reserved
/// slots for the new tokens, so the segments' token counts *include* them: the new tokens are
/// the last `tokens.len()` tokens of the last segment, and the sequence's total length after the
/// step is the sum of the segments' counts, which equals `start_pos + tokens.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardSeq {
    pub seq_id: SeqId,
    /// Tokens to run: a prefill piece, or the single last token for decode.
    pub tokens: Vec<TokenId>,
    /// Position of `tokens[0]` in the sequence (how many of its tokens already have KV).
    pub start_pos: usize,
    pub kv: Vec<BlockTable>,
    /// `Some` when this step must produce the next token (decode, or a prompt's last piece).
    pub sample: Option<SampleSpec>,
}

impl ForwardSeq {
    /// Tokens whose KV the sequence has after this step.
    pub fn total_len(&self) -> usize {
        self.start_pos + self.tokens.len()
    }
}

/// Several sequences attending to the same KV segment (FlashInfer's cascade attention): the
/// runner reads that segment once for all their queries and merges the partial result with
/// the rest of each sequence's attention by log-sum-exp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSegment {
    /// Indices into [`ForwardBatch::seqs`]; each has the same pages as its `kv[segment]`.
    pub seqs: Vec<usize>,
    /// Which segment of those sequences is shared.
    pub segment: usize,
}

/// A forward step: the sequences in order, and optionally which segments they share.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    pub seqs: Vec<ForwardSeq>,
    /// Empty means flat attention: every sequence reads all its segments on its own.
    pub shared: Vec<SharedSegment>,
}

impl ForwardBatch {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    pub fn num_sampled(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample.is_some()).count()
    }
}

/// Logits of the sampled sequences, one row of `vocab_size` per sequence with `sample: Some`,
/// in batch order.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub vocab_size: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn num_rows(&self) -> usize {
        self.data.len().checked_div(self.vocab_size).unwrap_or(0)
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab_size..(i + 1) * self.vocab_size]
    }
}

/// The input token of a decode step launched while the step before it still runs (see
/// [`ModelRunner::launch`]): "the token this sequence samples in the step launched just before",
/// which only the device knows yet. It is never a real token id.
pub const PENDING_TOKEN: TokenId = TokenId::MAX;

/// A model that can run forward steps over paged KV.
pub trait ModelRunner {
    /// The shape of one token's K/V: the engine sizes its page pool from it.
    fn kv_layout(&self) -> KvLayout;

    /// How many pages of `page_size()` tokens the runner's K/V storage holds.
    fn num_pages(&self) -> usize;

    fn page_size(&self) -> usize;

    fn vocab_size(&self) -> usize;

    /// Runs one step: writes the new tokens' K/V into their pages and returns the last-token
    /// logits of every sequence that samples.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error>;

    /// Copies the K/V of `src` into the slots of `dst` (same token count), turning the keys'
    /// rotary positions by `rope_shift`: K/V computed at positions `0..n` becomes the K/V of the
    /// same tokens at `shift..shift + n` (RoPE composes, so this is exact). The chunk API's
    /// independent mode places a chunk prefilled on its own after other chunks this way.
    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        let _ = (src, dst, rope_shift);
        Err(Error::Device(
            "this runner cannot copy K/V between pages".into(),
        ))
    }

    /// Runs one step and picks the next token of every sequence that samples, in batch
    /// order. The default samples on the host; a GPU runner samples on the device and copies
    /// back token ids only.
    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        let logits = self.forward(batch)?;
        let specs = batch.seqs.iter().filter_map(|s| s.sample);
        Ok(specs
            .enumerate()
            .map(|(i, spec)| crate::sampler::sample(logits.row(i), &spec))
            .collect())
    }

    /// Whether [`ModelRunner::launch`] and [`ModelRunner::collect`] work: a runner that queues
    /// work on a device and returns before it ran. Host runners compute in the call and say no.
    fn can_overlap(&self) -> bool {
        false
    }

    /// Queues a step like [`ModelRunner::forward_sample`] and returns before it has run;
    /// [`ModelRunner::collect`] returns its tokens, oldest launched step first. While the device
    /// computes step n the engine decides and launches step n+1 (SGLang's overlap scheduler),
    /// whose decode inputs are then [`PENDING_TOKEN`]: the tokens step n samples, taken on the
    /// device.
    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        let _ = batch;
        Err(Error::Device(
            "this runner computes steps synchronously".into(),
        ))
    }

    /// Waits for the oldest launched step and returns its sampled tokens, in batch order.
    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        Err(Error::Device(
            "this runner computes steps synchronously".into(),
        ))
    }
}

/// Checks the arguments of [`ModelRunner::copy_kv`] against a store of `num_pages` pages of
/// `page_size` tokens: both segments hold the same number of tokens, have the pages for them,
/// and name only pages of the store. Every runner's `copy_kv` starts with it.
pub fn check_copy_kv(
    src: &BlockTable,
    dst: &BlockTable,
    page_size: usize,
    num_pages: usize,
) -> Result<(), Error> {
    let n = src.num_tokens();
    if dst.num_tokens() != n
        || src.pages().len() * page_size < n
        || dst.pages().len() * page_size < n
    {
        return Err(Error::InvalidBatch(format!(
            "copy of {n} tokens into a segment of {}",
            dst.num_tokens()
        )));
    }
    let limit = num_pages as u32;
    if src.pages().iter().chain(dst.pages()).any(|&p| p >= limit) {
        return Err(Error::InvalidBatch(
            "copy names a page outside the store".into(),
        ));
    }
    Ok(())
}

/// A boxed runner is a runner, so an engine can hold "the CPU or the CUDA runner".
impl<R: ModelRunner + ?Sized> ModelRunner for Box<R> {
    fn kv_layout(&self) -> KvLayout {
        (**self).kv_layout()
    }

    fn num_pages(&self) -> usize {
        (**self).num_pages()
    }

    fn page_size(&self) -> usize {
        (**self).page_size()
    }

    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        (**self).forward(batch)
    }

    fn copy_kv(
        &mut self,
        src: &BlockTable,
        dst: &BlockTable,
        rope_shift: i64,
    ) -> Result<(), Error> {
        (**self).copy_kv(src, dst, rope_shift)
    }

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        (**self).forward_sample(batch)
    }

    fn can_overlap(&self) -> bool {
        (**self).can_overlap()
    }

    fn launch(&mut self, batch: &ForwardBatch) -> Result<(), Error> {
        (**self).launch(batch)
    }

    fn collect(&mut self) -> Result<Vec<TokenId>, Error> {
        (**self).collect()
    }
}
