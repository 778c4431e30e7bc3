//! Exercise 4.3: admission in order of the longest cached prefix.
//!
//! Build: [`longest_prefix_first`], the order in which to admit waiting prompts: the one
//! with the longest cached prefix first (equal ones in arrival order). This is SGLang's
//! default policy (`lpm`, longest prefix match).
//!
//! Why: when memory is short, the cache holds only a few prefixes at a time. Admitting the
//! requests that share what is cached *now* reuses it before it is evicted, where arrival
//! order would make groups of requests evict each other's prefixes in turn. The price is
//! fairness: a request nobody shares a prefix with waits while others keep hitting.
//!
//! Checked by `cargo test -p phase4 --features exercises --test exercises longest_prefix_first`.

use phase0::TokenId;

use crate::RadixTree;

/// Indices of `waiting` in admission order: cached prefix length (as `match_prefix` finds
/// it, over each prompt but its last token) longest first, then index.
pub fn longest_prefix_first(tree: &mut RadixTree, waiting: &[Vec<TokenId>]) -> Vec<usize> {
    if !cfg!(feature = "solutions") {
        todo!("exercise 4.3: order the waiting prompts by their cached prefix, longest first");
    }
    // BEGIN SOLUTION
    let mut keyed: Vec<(usize, usize)> = waiting
        .iter()
        .enumerate()
        .map(|(i, tokens)| {
            let lookup = &tokens[..tokens.len().saturating_sub(1)];
            (tree.match_prefix(lookup).num_tokens, i)
        })
        .collect();
    keyed.sort_by_key(|&(matched, i)| (std::cmp::Reverse(matched), i));
    keyed.into_iter().map(|(_, i)| i).collect()
    // END SOLUTION
}
