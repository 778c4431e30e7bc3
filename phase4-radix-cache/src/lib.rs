//! Chapter 4: the radix prefix cache.
//!
//! Chat turns, agents and few-shot prompts send the same long prefix again and again. SGLang's
//! RadixAttention keeps the K/V of finished requests in a radix tree keyed by token ids: a new
//! request walks the tree, reuses the pages of the longest cached prefix, and prefills only the
//! rest. Nodes in use by a running request are locked; when memory runs short the least
//! recently used unlocked leaves are evicted first.
//!
//! Matching compares tokens one by one, but sharing happens in whole pages: every edge of the
//! tree is a whole number of pages, and a match is rounded down to a page boundary. The tokens
//! of a partly matching page are *recomputed*, not copied: copying a page costs a kernel launch
//! and as much memory traffic as recomputing a few tokens, and it would make the node's page
//! writable by two owners.

#[cfg(feature = "exercises")]
pub mod exercises;
mod radix_cache;
mod radix_tree;
mod stats;

pub use radix_cache::RadixCache;
pub use radix_tree::{LeafInfo, MatchResult, NodeId, RadixTree};
pub use stats::CacheStats;
