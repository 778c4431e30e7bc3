//! Counters that say whether the cache earns its memory.

use std::fmt;

/// Lookups and hits of a prefix cache, and what it holds and gave back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompts looked up.
    pub lookups: u64,
    /// Prompt tokens looked up (all but each prompt's last token, which always runs).
    pub lookup_tokens: u64,
    /// Of those, tokens found in the cache: prefill that did not have to run.
    pub hit_tokens: u64,
    /// Tokens offered by finished or preempted sequences that were new to the tree.
    pub inserted_tokens: u64,
    /// Nodes evicted and the pages they gave back to the pool.
    pub evicted_nodes: u64,
    pub evicted_pages: u64,
    /// Pages the tree holds now.
    pub pages_held: u64,
}

impl CacheStats {
    /// Fraction of looked-up prompt tokens served from the cache.
    pub fn hit_rate(&self) -> f64 {
        if self.lookup_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.lookup_tokens as f64
        }
    }
}

impl fmt::Display for CacheStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lookups {}, hit tokens {}/{} ({:.1}%), inserted tokens {}, evicted {} nodes / {} pages, holding {} pages",
            self.lookups,
            self.hit_tokens,
            self.lookup_tokens,
            100.0 * self.hit_rate(),
            self.inserted_tokens,
            self.evicted_nodes,
            self.evicted_pages,
            self.pages_held
        )
    }
}
