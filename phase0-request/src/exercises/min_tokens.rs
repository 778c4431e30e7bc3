//! Exercise 0.1: `min_tokens`, a floor under the output length.
//!
//! Build: the stop rule of [`Sequence::append_token`](crate::Sequence::append_token) with one
//! more setting, `min_tokens`: an EOS or stop id ends the output only once at least
//! `min_tokens` tokens came before it (`max_tokens` still ends it in any case), and until then
//! the sampler may not even pick one (their logits are masked). A request is valid only when
//! `min_tokens <= max_tokens`.
//!
//! Why: a client that needs at least a sentence back (a summary, a title) must not get an
//! empty answer because EOS came first; vLLM's `min_tokens` sampling parameter does this.
//!
//! Checked by `cargo test -p phase0 --features exercises --test exercises min_tokens`.

use crate::{Error, FinishReason, SamplingParams, TokenId};

/// Sampling parameters plus a minimum output length.
#[derive(Debug, Clone, PartialEq)]
pub struct MinTokensParams {
    pub params: SamplingParams,
    pub min_tokens: usize,
}

impl MinTokensParams {
    /// Validates `params` as before, then `min_tokens` (at most `max_tokens`); the error
    /// names the field, `"min_tokens"`.
    pub fn validate(&self) -> Result<(), Error> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.1: validate `min_tokens` (at most `max_tokens`)");
        }
        // BEGIN SOLUTION
        self.params.validate()?;
        if self.min_tokens > self.params.max_tokens {
            return Err(Error::InvalidSamplingParams {
                field: "min_tokens",
                value: self.min_tokens.to_string(),
                reason: "must be <= max_tokens",
            });
        }
        Ok(())
        // END SOLUTION
    }

    /// Why the output stops after its newest token (`output` ends with it), or `None`: the
    /// rules of `append_token` (EOS unless ignored, then stop ids, then `max_tokens`), except
    /// that EOS and stop ids count only with at least `min_tokens` tokens before them.
    pub fn stop_reason(&self, output: &[TokenId], eos_ids: &[TokenId]) -> Option<FinishReason> {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.1: the stop rule with `min_tokens`");
        }
        // BEGIN SOLUTION
        let &token = output.last()?;
        let p = &self.params;
        let may_stop_early = output.len() > self.min_tokens;
        if may_stop_early && !p.ignore_eos && eos_ids.contains(&token) {
            Some(FinishReason::Eos)
        } else if may_stop_early && p.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if output.len() >= p.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
        // END SOLUTION
    }

    /// Before sampling the next token of an output that holds `num_output` tokens: while
    /// fewer than `min_tokens` came before it, sets the logits of the EOS ids (unless
    /// `ignore_eos`) and the stop ids to minus infinity, so none of them can be drawn. Ids
    /// outside `logits` are skipped.
    pub fn mask_early_stops(&self, logits: &mut [f32], num_output: usize, eos_ids: &[TokenId]) {
        if !cfg!(feature = "solutions") {
            todo!("exercise 0.1: mask EOS and stop ids below `min_tokens`");
        }
        // BEGIN SOLUTION
        if num_output >= self.min_tokens {
            return;
        }
        let eos = eos_ids.iter().filter(|_| !self.params.ignore_eos);
        for &id in eos.chain(&self.params.stop_token_ids) {
            if let Some(x) = logits.get_mut(id as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        // END SOLUTION
    }
}
