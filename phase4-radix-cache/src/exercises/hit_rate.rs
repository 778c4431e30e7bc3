//! Exercise 4.2: the cache's hit rate as a function of the page size.
//!
//! Build: [`hit_rate`], which serves requests one after the other through a radix tree the
//! way the scheduler does (match the prompt, compute the rest, insert what was computed) in
//! a pool with room for everything, and returns the share of prompt tokens that came from the
//! cache.
//!
//! Why: the tree matches token by token but shares whole pages, so a match is rounded down
//! to a page boundary. With 256-token pages a 50-token system prompt is never shared at all.
//! The sweep puts a number on the rounding and explains why SGLang defaults to one-token
//! pages and vLLM to 16.
//!
//! Checked by `cargo test -p phase4 --features exercises --test exercises hit_rate`.

use phase0::TokenId;
use phase1::KvPool;

use crate::RadixTree;

/// Serves `requests` in order with pages of `page_size` tokens: each request matches its
/// tokens except the last (which must run to give logits), has the rest computed into new
/// pages, and leaves its whole pages in the tree. Returns hit tokens / looked-up tokens
/// (0 when nothing was looked up).
pub fn hit_rate(requests: &[Vec<TokenId>], page_size: usize) -> f64 {
    if !cfg!(feature = "solutions") {
        todo!("exercise 4.2: serve the requests through a tree and count the hit tokens");
    }
    // BEGIN SOLUTION
    let pages: usize = requests.iter().map(|r| r.len().div_ceil(page_size)).sum();
    let mut pool = KvPool::new(pages, page_size).expect("a valid pool");
    let mut tree = RadixTree::new(page_size);
    let (mut hits, mut looked_up) = (0, 0);
    for tokens in requests.iter().filter(|r| !r.is_empty()) {
        let lookup = &tokens[..tokens.len() - 1];
        let m = tree.match_prefix(lookup);
        hits += m.num_tokens;
        looked_up += lookup.len();
        let full = tokens.len() / page_size;
        let mut own = m.pages.clone();
        for &p in &m.pages {
            pool.share(p).expect("tree pages are allocated");
        }
        own.extend(
            pool.allocate_many(full.saturating_sub(m.pages.len()))
                .expect("the pool has room for every request"),
        );
        tree.insert(&mut pool, &tokens[..full * page_size], &own[..full])
            .expect("the request holds its pages");
        pool.free_all(&own).expect("the request held them");
    }
    if looked_up == 0 {
        0.0
    } else {
        hits as f64 / looked_up as f64
    }
    // END SOLUTION
}
