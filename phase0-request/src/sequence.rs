//! A request as the user sends it, and the sequence the engine tracks for it.
//!
//! The life cycle is the one vLLM's scheduler uses:
//!
//! ```text
//!            start            append_token(...) hits EOS / stop / max_tokens
//!  Waiting ---------> Running ----------------------------------------------> Finished(reason)
//!     ^                  |
//!     +---- preempt -----+        abort: Waiting or Running --> Finished(Aborted)
//! ```
//!
//! Illegal changes (finishing twice, preempting a waiting sequence) are errors, not panics:
//! a scheduler bug then shows up as a clear message in a test.

use std::fmt;

use crate::error::Error;
use crate::sampling_params::SamplingParams;

/// A token id in the model's vocabulary.
pub type TokenId = u32;
/// The engine-wide id of a request and of its sequence.
pub type SeqId = u64;

/// What the user asked for: a prompt and how to sample its continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: SeqId,
    pub prompt: Vec<TokenId>,
    pub params: SamplingParams,
}

impl Request {
    pub fn new(id: SeqId, prompt: Vec<TokenId>, params: SamplingParams) -> Self {
        Self { id, prompt, params }
    }
}

/// Why a sequence stopped producing tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// It produced `max_tokens` tokens (or reached the model's length limit).
    Length,
    /// It produced an end-of-sequence token and `ignore_eos` was off.
    Eos,
    /// It produced one of its `stop_token_ids`.
    Stop,
    /// The user or the engine cancelled it.
    Aborted,
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Aborted => "aborted",
        })
    }
}

/// Where a sequence is in its life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SequenceStatus {
    Waiting,
    Running,
    Finished(FinishReason),
}

impl fmt::Display for SequenceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SequenceStatus::Waiting => f.write_str("waiting"),
            SequenceStatus::Running => f.write_str("running"),
            SequenceStatus::Finished(reason) => write!(f, "finished ({reason})"),
        }
    }
}

/// The engine's view of one request: its tokens so far and its status.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    id: SeqId,
    prompt: Vec<TokenId>,
    output: Vec<TokenId>,
    params: SamplingParams,
    status: SequenceStatus,
    num_preemptions: u32,
}

impl Sequence {
    /// Admits a request: its sampling params must be valid and its prompt non-empty.
    pub fn new(request: Request) -> Result<Self, Error> {
        request.params.validate()?;
        if request.prompt.is_empty() {
            return Err(Error::EmptyPrompt(request.id));
        }
        Ok(Self {
            id: request.id,
            prompt: request.prompt,
            output: Vec::new(),
            params: request.params,
            status: SequenceStatus::Waiting,
            num_preemptions: 0,
        })
    }

    pub fn id(&self) -> SeqId {
        self.id
    }

    pub fn prompt(&self) -> &[TokenId] {
        &self.prompt
    }

    pub fn output(&self) -> &[TokenId] {
        &self.output
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn status(&self) -> SequenceStatus {
        self.status
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, SequenceStatus::Finished(_))
    }

    /// Why it finished, once it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        match self.status {
            SequenceStatus::Finished(reason) => Some(reason),
            _ => None,
        }
    }

    /// How many times the scheduler took this sequence's pages away.
    pub fn num_preemptions(&self) -> u32 {
        self.num_preemptions
    }

    /// Prompt plus output: the tokens whose KV the model needs for the next step.
    pub fn len(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Never true for a valid sequence (the prompt is non-empty); here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token `i` of prompt-then-output.
    pub fn token(&self, i: usize) -> TokenId {
        if i < self.prompt.len() {
            self.prompt[i]
        } else {
            self.output[i - self.prompt.len()]
        }
    }

    /// Prompt followed by output, as one vector (used when a preempted sequence is recomputed).
    pub fn all_tokens(&self) -> Vec<TokenId> {
        let mut all = Vec::with_capacity(self.len());
        all.extend_from_slice(&self.prompt);
        all.extend_from_slice(&self.output);
        all
    }

    /// The last token: the input of the next decode step.
    pub fn last_token(&self) -> TokenId {
        *self
            .output
            .last()
            .unwrap_or_else(|| self.prompt.last().expect("a sequence always has a prompt"))
    }

    fn illegal(&self, action: &'static str) -> Error {
        Error::IllegalTransition {
            id: self.id,
            from: self.status,
            action,
        }
    }

    /// Waiting -> Running: the scheduler gave it pages and a place in the batch.
    pub fn start(&mut self) -> Result<(), Error> {
        // BEGIN SOLUTION
        match self.status {
            SequenceStatus::Waiting => {
                self.status = SequenceStatus::Running;
                Ok(())
            }
            _ => Err(self.illegal("start")),
        }
        // END SOLUTION
    }

    /// Running -> Waiting: its pages were taken back; its tokens are kept so that it can be
    /// recomputed later (vLLM's "recompute" preemption).
    pub fn preempt(&mut self) -> Result<(), Error> {
        // BEGIN SOLUTION
        match self.status {
            SequenceStatus::Running => {
                self.status = SequenceStatus::Waiting;
                self.num_preemptions += 1;
                Ok(())
            }
            _ => Err(self.illegal("preempt")),
        }
        // END SOLUTION
    }

    /// Ends the sequence. Only a running sequence finishes on its own; an abort may also
    /// hit one that is still waiting.
    pub fn finish(&mut self, reason: FinishReason) -> Result<(), Error> {
        // BEGIN SOLUTION
        match (self.status, reason) {
            (SequenceStatus::Running, _) | (SequenceStatus::Waiting, FinishReason::Aborted) => {
                self.status = SequenceStatus::Finished(reason);
                Ok(())
            }
            _ => Err(self.illegal("finish")),
        }
        // END SOLUTION
    }

    /// Appends a sampled token and applies the stop rules in vLLM's order: EOS (unless
    /// ignored), then the stop ids, then `max_tokens`. Returns the reason when it finished.
    /// The stopping token is kept in the output, as the reference engines do.
    pub fn append_token(
        &mut self,
        token: TokenId,
        eos_ids: &[TokenId],
    ) -> Result<Option<FinishReason>, Error> {
        // BEGIN SOLUTION
        if self.status != SequenceStatus::Running {
            return Err(self.illegal("append a token"));
        }
        self.output.push(token);
        let reason = if !self.params.ignore_eos && eos_ids.contains(&token) {
            Some(FinishReason::Eos)
        } else if self.params.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.output.len() >= self.params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.status = SequenceStatus::Finished(reason);
        }
        Ok(reason)
        // END SOLUTION
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(max_tokens: usize) -> Sequence {
        let params = SamplingParams::default()
            .with_max_tokens(max_tokens)
            .with_stop_token_ids(vec![7]);
        Sequence::new(Request::new(1, vec![10, 11, 12], params)).unwrap()
    }

    #[test]
    fn new_sequence_waits_with_its_prompt() {
        let s = seq(4);
        assert_eq!(s.status(), SequenceStatus::Waiting);
        assert_eq!(s.prompt(), &[10, 11, 12]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.last_token(), 12);
        assert_eq!(s.finish_reason(), None);
    }

    #[test]
    fn bad_requests_are_refused() {
        let err = Sequence::new(Request::new(3, vec![], SamplingParams::default())).unwrap_err();
        assert_eq!(err, Error::EmptyPrompt(3));
        let bad = SamplingParams::default().with_top_k(0);
        let err = Sequence::new(Request::new(4, vec![1], bad)).unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidSamplingParams { field: "top_k", .. }
        ));
    }

    #[test]
    fn max_tokens_finishes_with_length() {
        let mut s = seq(2);
        s.start().unwrap();
        assert_eq!(s.append_token(1, &[0]).unwrap(), None);
        assert_eq!(s.append_token(2, &[0]).unwrap(), Some(FinishReason::Length));
        assert_eq!(s.output(), &[1, 2]);
        assert_eq!(s.all_tokens(), vec![10, 11, 12, 1, 2]);
        assert_eq!(s.token(4), 2);
        assert!(s.is_finished());
    }

    #[test]
    fn eos_and_stop_ids_finish_and_are_kept() {
        let mut s = seq(10);
        s.start().unwrap();
        assert_eq!(s.append_token(0, &[0]).unwrap(), Some(FinishReason::Eos));
        assert_eq!(s.output(), &[0]);

        let mut s = seq(10);
        s.start().unwrap();
        assert_eq!(s.append_token(7, &[0]).unwrap(), Some(FinishReason::Stop));
    }

    #[test]
    fn ignore_eos_keeps_going() {
        let params = SamplingParams::default()
            .with_max_tokens(3)
            .with_ignore_eos(true);
        let mut s = Sequence::new(Request::new(1, vec![5], params)).unwrap();
        s.start().unwrap();
        assert_eq!(s.append_token(0, &[0]).unwrap(), None);
        assert_eq!(s.append_token(0, &[0]).unwrap(), None);
        assert_eq!(s.append_token(0, &[0]).unwrap(), Some(FinishReason::Length));
    }

    #[test]
    fn preemption_goes_back_to_waiting_and_keeps_tokens() {
        let mut s = seq(10);
        s.start().unwrap();
        s.append_token(3, &[0]).unwrap();
        s.preempt().unwrap();
        assert_eq!(s.status(), SequenceStatus::Waiting);
        assert_eq!(s.num_preemptions(), 1);
        assert_eq!(s.all_tokens(), vec![10, 11, 12, 3]);
        s.start().unwrap();
        assert_eq!(s.status(), SequenceStatus::Running);
    }

    #[test]
    fn illegal_transitions_are_errors() {
        let mut s = seq(10);
        let err = s.preempt().unwrap_err();
        assert_eq!(err.to_string(), "sequence 1: cannot preempt while waiting");
        assert!(s.append_token(1, &[]).is_err());
        assert!(s.finish(FinishReason::Length).is_err());
        s.start().unwrap();
        assert!(s.start().is_err());
        s.finish(FinishReason::Stop).unwrap();
        let err = s.finish(FinishReason::Aborted).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sequence 1: cannot finish while finished (stop)"
        );
        assert!(s.start().is_err());
        assert!(s.preempt().is_err());
    }

    #[test]
    fn abort_works_while_waiting_or_running() {
        let mut s = seq(10);
        s.finish(FinishReason::Aborted).unwrap();
        assert_eq!(s.finish_reason(), Some(FinishReason::Aborted));
        let mut s = seq(10);
        s.start().unwrap();
        s.finish(FinishReason::Aborted).unwrap();
        assert_eq!(s.finish_reason(), Some(FinishReason::Aborted));
    }
}
