//! A sequence inside the scheduler: its tokens, the KV pages it reads and owns, and how much
//! of it the model has computed.
//!
//! `num_computed` is the one number the whole scheduler turns on: tokens `0..num_computed`
//! have K/V in pages; the next step must feed tokens `num_computed..len`. After admission that
//! is the prompt (prefill); while decoding it is the one token sampled last; after a
//! preemption it is prompt and output again (recompute).

use phase0::{Sequence, TokenId};
use phase1::{BlockTable, KvPool};

use crate::runner::{ForwardSeq, SampleSpec};

#[derive(Debug, Clone)]
pub struct SeqState {
    pub seq: Sequence,
    /// KV computed elsewhere and read here (a registered chunk, ...): first, in order.
    pub shared_kv: Vec<BlockTable>,
    /// This sequence's own pages, after the shared ones; new tokens are written here.
    pub own_kv: BlockTable,
    /// Tokens (shared ones included) whose K/V is already computed.
    pub num_computed: usize,
    /// The random stream of this request (its seed, or one the engine drew).
    pub seed: u64,
    /// When it finishes, hand its own pages to the caller instead of freeing them (a chunk's
    /// KV being computed, a conversation kept for later turns).
    pub keep_kv: bool,
}

impl SeqState {
    pub fn new(seq: Sequence, seed: u64) -> Self {
        Self {
            seq,
            shared_kv: Vec::new(),
            own_kv: BlockTable::new(),
            num_computed: 0,
            seed,
            keep_kv: false,
        }
    }

    /// A sequence whose first tokens already have K/V in `shared` segments (registered chunks,
    /// blocks of an earlier conversation): only the rest of its prompt is computed.
    pub fn with_shared_kv(seq: Sequence, seed: u64, shared: Vec<BlockTable>) -> Self {
        let num_computed = shared.iter().map(BlockTable::num_tokens).sum();
        Self {
            shared_kv: shared,
            num_computed,
            ..Self::new(seq, seed)
        }
    }

    pub fn id(&self) -> phase0::SeqId {
        self.seq.id()
    }

    pub fn num_shared_tokens(&self) -> usize {
        self.shared_kv.iter().map(BlockTable::num_tokens).sum()
    }

    /// Tokens that have a KV slot (computed or reserved for this step).
    pub fn kv_len(&self) -> usize {
        self.num_shared_tokens() + self.own_kv.num_tokens()
    }

    /// Tokens still to feed before the next token can be sampled.
    pub fn num_uncomputed(&self) -> usize {
        self.seq.len() - self.num_computed
    }

    /// Still in its prompt (or recompute) phase: more than the one decode token is left.
    pub fn is_prefilling(&self) -> bool {
        self.num_uncomputed() > 1 || self.seq.output().is_empty()
    }

    /// Reserves own pages so that `n` more tokens have slots (all or nothing).
    pub fn reserve(&mut self, pool: &mut KvPool, n: usize) -> Result<(), phase1::Error> {
        let target = self.num_computed + n;
        let have = self.kv_len();
        if target > have {
            self.own_kv.append_tokens(pool, target - have)?;
        }
        Ok(())
    }

    /// The forward input for the next `n` uncomputed tokens. It samples when those tokens
    /// reach the end of the sequence; slots must be reserved first.
    pub fn forward_seq(&self, n: usize) -> ForwardSeq {
        let start = self.num_computed;
        let tokens: Vec<TokenId> = (start..start + n).map(|i| self.seq.token(i)).collect();
        let sample = (start + n == self.seq.len())
            .then(|| SampleSpec::new(self.seq.params(), self.seed, self.seq.output().len() as u64));
        let mut kv = self.shared_kv.clone();
        kv.push(BlockTable::from_pages(
            self.own_kv.pages().to_vec(),
            start + n - self.num_shared_tokens(),
        ));
        ForwardSeq {
            seq_id: self.id(),
            tokens,
            start_pos: start,
            kv,
            sample,
        }
    }

    /// Gives the own pages back to the pool (shared segments belong to their owners).
    pub fn release(&mut self, pool: &mut KvPool) -> Result<(), phase1::Error> {
        self.own_kv.release(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phase0::{Request, SamplingParams};

    fn state(prompt: Vec<u32>) -> SeqState {
        let params = SamplingParams::greedy().with_max_tokens(4);
        SeqState::new(Sequence::new(Request::new(1, prompt, params)).unwrap(), 9)
    }

    #[test]
    fn prefill_then_decode_feeds_the_right_tokens() {
        let mut pool = KvPool::new(8, 4).unwrap();
        let mut s = state(vec![5, 6, 7, 8, 9]);
        assert!(s.is_prefilling());
        s.reserve(&mut pool, 5).unwrap();
        let f = s.forward_seq(5);
        assert_eq!((f.tokens.clone(), f.start_pos), (vec![5, 6, 7, 8, 9], 0));
        assert_eq!(f.kv[0].num_tokens(), 5);
        assert_eq!(f.sample.unwrap().step, 0);

        s.num_computed = 5;
        s.seq.start().unwrap();
        s.seq.append_token(42, &[]).unwrap();
        assert!(!s.is_prefilling());
        s.reserve(&mut pool, 1).unwrap();
        let f = s.forward_seq(1);
        assert_eq!((f.start_pos, f.total_len()), (5, 6));
        assert_eq!(f.tokens, vec![42]);
        assert_eq!(f.kv[0].num_tokens(), 6);
        assert_eq!(f.sample.unwrap().step, 1);
        assert_eq!(pool.num_used(), 2);
        s.release(&mut pool).unwrap();
        assert_eq!(pool.num_free(), 8);
    }

    #[test]
    fn a_first_piece_of_a_prompt_does_not_sample() {
        let mut pool = KvPool::new(8, 4).unwrap();
        let mut s = state(vec![1, 2, 3, 4, 5, 6]);
        s.reserve(&mut pool, 4).unwrap();
        let f = s.forward_seq(4);
        assert!(f.sample.is_none());
        assert_eq!(s.own_kv.num_tokens(), 4);
    }
}
