//! The seam between scheduling and math: what one forward step is asked to compute.
//!
//! Everything above this trait (pools, schedulers, caches, the engine) is backend-free; the
//! CPU runner of this chapter and the CUDA runner of chapter 6 sit below it and must give the
//! same tokens. A step is a list of sequences, each bringing some new tokens (a prefill piece
//! or one decode token) and the pages that hold its KV.

use phase0::{SamplingParams, SeqId, TokenId};
use std::any::Any;

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
/// `kv` lists the sequence's KV as segments (docs/ARCHITECTURE.md, "KV segments"): shared segments first (a cached
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

/// A forward step: the sequences in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    pub seqs: Vec<ForwardSeq>,
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

/// What a runner can take in one step; [`validate_batch`] checks a batch against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub page_size: usize,
    /// Pages in the runner's K/V storage.
    pub num_pages: usize,
    pub vocab_size: usize,
    /// The model's `max_position_embeddings`.
    pub max_position: usize,
    /// Most sequences and tokens per step (`usize::MAX` for a runner that sizes nothing ahead).
    pub max_seqs: usize,
    pub max_tokens: usize,
}

/// Checks everything a forward pass relies on, so that a bad batch is an error and never a
/// panic or an out-of-bounds read: step size, each sequence's segments against its tokens and
/// positions, pages inside the store, tokens inside the vocabulary.
pub fn validate_batch(batch: &ForwardBatch, limits: &BatchLimits) -> Result<(), Error> {
    validate_segments(batch, limits)?;
    for s in &batch.seqs {
        if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= limits.vocab_size) {
            return Err(Error::InvalidBatch(format!(
                "sequence {}: token {t} is outside the vocabulary of {}",
                s.seq_id, limits.vocab_size
            )));
        }
    }
    Ok(())
}

/// [`validate_batch`] without the token ids: for a runner that fills in some inputs itself.
pub fn validate_segments(batch: &ForwardBatch, limits: &BatchLimits) -> Result<(), Error> {
    let bad = |s: String| Err(Error::InvalidBatch(s));
    let ps = limits.page_size;
    if batch.seqs.len() > limits.max_seqs {
        return bad(format!(
            "{} sequences, the runner was sized for {}",
            batch.seqs.len(),
            limits.max_seqs
        ));
    }
    if batch.num_tokens() > limits.max_tokens {
        return bad(format!(
            "{} tokens, the runner was sized for {} per step",
            batch.num_tokens(),
            limits.max_tokens
        ));
    }
    for s in &batch.seqs {
        let id = s.seq_id;
        let Some(own) = s.kv.last() else {
            return bad(format!("sequence {id} has no KV segment"));
        };
        if s.tokens.is_empty() {
            return bad(format!("sequence {id} has no tokens to run"));
        }
        let kv_len: usize = s.kv.iter().map(BlockTable::num_tokens).sum();
        if kv_len != s.total_len() || own.num_tokens() < s.tokens.len() {
            return bad(format!(
                "sequence {id}: its segments hold {kv_len} tokens, expected {} with the last {} in its own segment",
                s.total_len(),
                s.tokens.len()
            ));
        }
        if s.total_len() > limits.max_position {
            return bad(format!(
                "sequence {id} reaches position {}, beyond the model's {}",
                s.total_len(),
                limits.max_position
            ));
        }
        for segment in &s.kv {
            if segment.pages().len() * ps < segment.num_tokens() {
                return bad(format!(
                    "sequence {id}: a segment of {} tokens has too few pages",
                    segment.num_tokens()
                ));
            }
            if let Some(&p) = segment
                .pages()
                .iter()
                .find(|&&p| p as usize >= limits.num_pages)
            {
                return bad(format!(
                    "sequence {id}: page {p} is outside the store of {} pages",
                    limits.num_pages
                ));
            }
        }
    }
    Ok(())
}

/// A model that can run forward steps over paged KV.
pub trait ModelRunner: Any {
    /// The shape of one token's K/V: the engine sizes its page pool from it.
    fn kv_layout(&self) -> KvLayout;

    /// How many pages of `page_size()` tokens the runner's K/V storage holds.
    fn num_pages(&self) -> usize;

    fn page_size(&self) -> usize;

    fn vocab_size(&self) -> usize;

    /// Runs one step: writes the new tokens' K/V into their pages and returns the last-token
    /// logits of every sequence that samples.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error>;

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

    fn forward_sample(&mut self, batch: &ForwardBatch) -> Result<Vec<TokenId>, Error> {
        (**self).forward_sample(batch)
    }
}
