//! Naming a full page of tokens by its whole prefix.
//!
//! Two requests can share a page only if the page's tokens *and everything before them* are
//! identical, because a token's K/V depends on all earlier tokens (causal attention). So a
//! page's hash covers its tokens and the hash of the page before it: a chain, as in vLLM's
//! automatic prefix caching. Equal hashes then mean equal prefixes up to and including that
//! page (SHA-256 makes an accidental collision negligible).

use std::fmt;

use phase0::TokenId;
use sha2::{Digest, Sha256};

/// The chain hash of one full page and every page before it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub [u8; 32]);

impl PageHash {
    /// Hash of `tokens` (one full page) following the page whose hash is `parent`. The
    /// SHA-256 of, in order: the parent's 32 bytes, or for a first page (no parent) the 17
    /// ASCII bytes `nano-serving/root`; then each token id as 4 little-endian bytes. A first
    /// page of tokens 1, 2, 3, 4 prints as `23200388`.
    pub fn chain(parent: Option<&PageHash>, tokens: &[TokenId]) -> PageHash {
        // BEGIN SOLUTION
        let mut hasher = Sha256::new();
        match parent {
            Some(p) => hasher.update(p.0),
            // A fixed tag for "no parent" keeps a first page distinct from any chained page.
            None => hasher.update(b"nano-serving/root"),
        }
        for t in tokens {
            hasher.update(t.to_le_bytes());
        }
        PageHash(hasher.finalize().into())
        // END SOLUTION
    }
}

impl fmt::Debug for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageHash({self})")
    }
}

/// The first 4 bytes in hex: enough to tell pages apart when people read a dump.
impl fmt::Display for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Chain hashes of every *full* page of `tokens`; a partly filled last page has none.
pub fn prefix_hashes(tokens: &[TokenId], page_size: usize) -> Vec<PageHash> {
    let mut hashes: Vec<PageHash> = Vec::with_capacity(tokens.len() / page_size);
    for page in tokens.chunks_exact(page_size) {
        let h = PageHash::chain(hashes.last(), page);
        hashes.push(h);
    }
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_prefixes_give_equal_hashes_and_the_chain_sees_the_past() {
        let a = prefix_hashes(&[1, 2, 3, 4, 5, 6, 7], 2);
        let b = prefix_hashes(&[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3, "the partial last page has no hash");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // The same tokens after a different prefix are a different page.
        let c = prefix_hashes(&[0, 0, 3, 4], 2);
        assert_ne!(a[1], c[1]);
        // A first page differs from the same tokens chained after another page.
        assert_ne!(PageHash::chain(None, &[3, 4]), a[1]);
    }

    #[test]
    fn the_bytes_hashed_are_the_root_tag_or_parent_then_little_endian_ids() {
        let first = PageHash::chain(None, &[1, 2, 3, 4]);
        let second = PageHash::chain(Some(&first), &[5, 6, 7, 8]);
        let why = "SHA-256 of b\"nano-serving/root\" (no parent) or the parent's 32 bytes, \
                   then each token as u32::to_le_bytes; printed as the first 4 bytes in hex";
        assert_eq!(first.to_string(), "23200388", "{why}");
        assert_eq!(second.to_string(), "265e42df", "{why}");
    }

    #[test]
    fn display_is_short_hex() {
        let h = PageHash::chain(None, &[1, 2]);
        assert_eq!(h.to_string().len(), 8);
        assert_eq!(format!("{h:?}"), format!("PageHash({h})"));
    }
}
