//! Chapter 6.4's step plan (split from the CUDA runner): what one forward step of the CUDA
//! runner does, worked out on the host before anything is uploaded. Which row each token
//! occupies, where its K/V goes, which pages each attention call reads ([`StepPlan`]), and how
//! KV that queries see whole is cut into pieces attended at once ([`split`]). Nothing here
//! touches the GPU, so it is tested on any machine.

pub mod plan;
pub mod split;

pub use plan::{Level, Limits, Prefill, StepPlan, Table};
pub use split::KvSplit;

use phase0::TokenId;

/// The input token of a decode step launched while the step before it still runs: "the token
/// this sequence samples in the step launched just before" (chapter 6.4's overlap scheduling).
/// It is never a real token id; a plan lets it through only as the input of a one-token
/// sequence, which the runner takes on the device.
pub const PENDING_TOKEN: TokenId = TokenId::MAX;
