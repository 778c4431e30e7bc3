//! The errors of chapter 0: bad sampling parameters, bad requests and illegal status changes.

use crate::sequence::{SeqId, SequenceStatus};

/// Everything that can go wrong with a request before it reaches the model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A sampling parameter is out of its range; `field` names it so a client can fix it.
    #[error("invalid sampling params: {field} = {value} ({reason})")]
    InvalidSamplingParams {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    /// A request with no prompt tokens: there is nothing to condition the model on.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(SeqId),
    /// The state machine refused a change, e.g. finishing a sequence twice.
    #[error("sequence {id}: cannot {action} while {from}")]
    IllegalTransition {
        id: SeqId,
        from: SequenceStatus,
        action: &'static str,
    },
}
