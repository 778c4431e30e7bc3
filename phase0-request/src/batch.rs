//! One engine step's work: which sequences run and how many tokens each contributes.
//!
//! A prefill entry feeds a run of prompt tokens (the whole prompt, or one piece of it when
//! prefill is chunked); a decode entry feeds exactly one token, the last one sampled. Prefill
//! is many tokens per sequence and compute-bound; decode is one token per sequence and
//! memory-bound, which is why schedulers treat them differently.

use std::fmt;

use crate::sequence::SeqId;

/// What one sequence does in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Tokens `start .. start + num_tokens` of the sequence go through the model.
    Prefill { start: usize },
    /// The sequence's last token goes through the model to produce the next one.
    Decode,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    pub seq_id: SeqId,
    pub kind: EntryKind,
    pub num_tokens: usize,
}

/// The shape of a whole step, derived from its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Empty,
    Prefill,
    Decode,
    /// Prefill pieces and decodes together (chunked prefill, chapter 3).
    Mixed,
}

/// The sequences of one step, in the order the model sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    entries: Vec<BatchEntry>,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds tokens `start .. start + num_tokens` of a sequence's prompt.
    pub fn push_prefill(&mut self, seq_id: SeqId, start: usize, num_tokens: usize) {
        self.entries.push(BatchEntry {
            seq_id,
            kind: EntryKind::Prefill { start },
            num_tokens,
        });
    }

    /// Adds one decode token for a sequence.
    pub fn push_decode(&mut self, seq_id: SeqId) {
        self.entries.push(BatchEntry {
            seq_id,
            kind: EntryKind::Decode,
            num_tokens: 1,
        });
    }

    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn num_seqs(&self) -> usize {
        self.entries.len()
    }

    /// All tokens the model processes in this step.
    pub fn num_tokens(&self) -> usize {
        self.entries.iter().map(|e| e.num_tokens).sum()
    }

    pub fn num_prefill_tokens(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::Prefill { .. }))
            .map(|e| e.num_tokens)
            .sum()
    }

    pub fn num_decode_tokens(&self) -> usize {
        self.num_tokens() - self.num_prefill_tokens()
    }

    pub fn kind(&self) -> BatchKind {
        match (self.num_prefill_tokens() > 0, self.num_decode_tokens() > 0) {
            (false, false) => BatchKind::Empty,
            (true, false) => BatchKind::Prefill,
            (false, true) => BatchKind::Decode,
            (true, true) => BatchKind::Mixed,
        }
    }
}

/// One line per step, e.g. `prefill #1[0..12] #2[0..30] | decode #3 #4`, for traces.
impl fmt::Display for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut wrote = false;
        for (label, want_prefill) in [("prefill", true), ("decode", false)] {
            let mut first = true;
            for e in &self.entries {
                let is_prefill = matches!(e.kind, EntryKind::Prefill { .. });
                if is_prefill != want_prefill {
                    continue;
                }
                if first {
                    if wrote {
                        f.write_str(" | ")?;
                    }
                    f.write_str(label)?;
                    first = false;
                    wrote = true;
                }
                match e.kind {
                    EntryKind::Prefill { start } => {
                        write!(f, " #{}[{}..{}]", e.seq_id, start, start + e.num_tokens)?
                    }
                    EntryKind::Decode => write!(f, " #{}", e.seq_id)?,
                }
            }
        }
        if !wrote {
            f.write_str("idle")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_kind_follow_the_entries() {
        let mut b = Batch::new();
        assert_eq!(b.kind(), BatchKind::Empty);
        assert_eq!(b.to_string(), "idle");
        b.push_prefill(1, 0, 12);
        b.push_prefill(2, 16, 30);
        assert_eq!(b.kind(), BatchKind::Prefill);
        b.push_decode(3);
        b.push_decode(4);
        assert_eq!(b.kind(), BatchKind::Mixed);
        assert_eq!(b.num_seqs(), 4);
        assert_eq!(b.num_tokens(), 44);
        assert_eq!(b.num_prefill_tokens(), 42);
        assert_eq!(b.num_decode_tokens(), 2);
        insta::assert_snapshot!(b.to_string(), @"prefill #1[0..12] #2[16..46] | decode #3 #4");
    }

    #[test]
    fn decode_only_batch() {
        let mut b = Batch::new();
        b.push_decode(9);
        assert_eq!(b.kind(), BatchKind::Decode);
        assert_eq!(b.to_string(), "decode #9");
    }
}
