//! A stand-in model for scheduler tests: exact, instant, and sensitive to every page.
//!
//! `HashRunner` stores token ids instead of K/V vectors, in the same pages a real runner
//! would use, and "predicts" the next token as a hash of every token it reads back through
//! the sequence's block tables, in order. So its output changes if a scheduler hands it a
//! wrong page, a stale page, a missing slot or a wrong position, and it runs in
//! microseconds: scheduler properties (batched == alone, preemption changes nothing, no
//! page leaks) can be checked on thousands of random workloads. The real model's tests then
//! only need to show that the real runner honours the same contract.

use phase0::TokenId;
use phase1::{KvDtype, KvLayout};

use crate::error::Error;
use crate::runner::{ForwardBatch, Logits, ModelRunner};

const EMPTY: TokenId = TokenId::MAX;

pub struct HashRunner {
    page_size: usize,
    vocab_size: usize,
    /// `slots[page * page_size + offset]`: the token whose "KV" lives there.
    slots: Vec<TokenId>,
}

impl HashRunner {
    pub fn new(num_pages: usize, page_size: usize, vocab_size: usize) -> Self {
        Self {
            page_size,
            vocab_size,
            slots: vec![EMPTY; num_pages * page_size],
        }
    }

    fn slot_index(&self, page: u32, offset: usize) -> Result<usize, Error> {
        let i = page as usize * self.page_size + offset;
        if i < self.slots.len() {
            Ok(i)
        } else {
            Err(Error::InvalidBatch(format!(
                "page {page} is outside the store"
            )))
        }
    }

    /// The token after the given history: a hash of every (position, token) pair.
    pub fn next_token(history: &[TokenId], vocab_size: usize) -> TokenId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (pos, &t) in history.iter().enumerate() {
            h = (h ^ (t as u64) ^ ((pos as u64) << 32)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        (h % vocab_size as u64) as TokenId
    }
}

impl ModelRunner for HashRunner {
    fn kv_layout(&self) -> KvLayout {
        KvLayout {
            num_layers: 1,
            num_kv_heads: 1,
            head_dim: 1,
            dtype: KvDtype::F32,
        }
    }

    fn num_pages(&self) -> usize {
        self.slots.len() / self.page_size
    }

    fn page_size(&self) -> usize {
        self.page_size
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Logits, Error> {
        let mut data = Vec::new();
        for seq in &batch.seqs {
            let (own, shared) = seq
                .kv
                .split_last()
                .ok_or_else(|| Error::InvalidBatch(format!("sequence {} has no KV", seq.seq_id)))?;
            let shared_len: usize = shared.iter().map(|t| t.num_tokens()).sum();
            if shared_len + own.num_tokens() != seq.total_len() || seq.start_pos < shared_len {
                return Err(Error::InvalidBatch(format!(
                    "sequence {}: KV holds {} tokens, expected {}",
                    seq.seq_id,
                    shared_len + own.num_tokens(),
                    seq.total_len()
                )));
            }
            // Write the new tokens into their slots, as a real runner writes K/V.
            for (i, &t) in seq.tokens.iter().enumerate() {
                let slot = own.slot(seq.start_pos - shared_len + i, self.page_size);
                let idx = self.slot_index(slot.page, slot.offset)?;
                self.slots[idx] = t;
            }
            if seq.sample.is_none() {
                continue;
            }
            // Read the whole history back through the pages, as attention does.
            let mut history = Vec::with_capacity(seq.total_len());
            for table in &seq.kv {
                for i in 0..table.num_tokens() {
                    let slot = table.slot(i, self.page_size);
                    history.push(self.slots[self.slot_index(slot.page, slot.offset)?]);
                }
            }
            let next = Self::next_token(&history, self.vocab_size);
            // Every other token impossible, so any sampling settings pick `next`.
            let mut row = vec![f32::NEG_INFINITY; self.vocab_size];
            row[next as usize] = 0.0;
            data.extend(row);
        }
        Ok(Logits {
            vocab_size: self.vocab_size,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{ForwardSeq, SampleSpec};
    use phase1::{BlockTable, KvPool};

    #[test]
    fn reads_back_what_was_written_across_pages_and_steps() {
        let mut pool = KvPool::new(4, 2).unwrap();
        let mut runner = HashRunner::new(4, 2, 50);
        let mut table = BlockTable::new();
        table.append_tokens(&mut pool, 3).unwrap();
        let prefill = ForwardSeq {
            seq_id: 1,
            tokens: vec![7, 8, 9],
            start_pos: 0,
            kv: vec![table.clone()],
            sample: Some(SampleSpec::greedy()),
        };
        let batch = ForwardBatch {
            seqs: vec![prefill],
        };
        let first = runner.forward_sample(&batch).unwrap()[0];
        assert_eq!(first, HashRunner::next_token(&[7, 8, 9], 50));

        table.append_slot(&mut pool).unwrap();
        let decode = ForwardSeq {
            seq_id: 1,
            tokens: vec![first],
            start_pos: 3,
            kv: vec![table],
            sample: Some(SampleSpec::greedy()),
        };
        let second = runner
            .forward_sample(&ForwardBatch { seqs: vec![decode] })
            .unwrap()[0];
        assert_eq!(second, HashRunner::next_token(&[7, 8, 9, first], 50));
    }

    #[test]
    fn a_wrong_token_count_is_an_error() {
        let mut runner = HashRunner::new(2, 2, 10);
        let seq = ForwardSeq {
            seq_id: 3,
            tokens: vec![1, 2],
            start_pos: 0,
            kv: vec![BlockTable::from_pages(vec![0], 1)],
            sample: None,
        };
        let err = runner
            .forward(&ForwardBatch { seqs: vec![seq] })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid batch: sequence 3: KV holds 1 tokens, expected 2"
        );
    }
}
