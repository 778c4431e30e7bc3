//! The chunks and the K/V the chunk API holds for them, with its memory budget.
//!
//! Two kinds of K/V live here: a chunk's own (a system prompt, prefilled at registration at
//! position 0; in independent mode every context too), and *chain* segments: in exact mode the
//! K/V of a context computed after a particular system prompt and contexts (keyed by that
//! chain of chunk ids); in independent mode a context's K/V turned to a particular offset.
//! Every segment starts on a fresh page and may end in a partly filled one. Items are evicted
//! least recently used first when the page budget or the chunk count is full; items pinned by
//! the composition being built are never evicted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use phase0::TokenId;
use phase1::{BlockTable, KvPool};

use crate::types::{ChunkInfo, ChunkType};

/// A registered chunk.
#[derive(Debug, Clone)]
pub struct StoredChunk {
    pub info: ChunkInfo,
    pub content: String,
    pub tokens: Vec<TokenId>,
    /// Its own K/V at positions `0..len`, when it has been computed.
    pub kv: Option<BlockTable>,
    pub last_used: u64,
}

/// K/V of a chunk in a particular place (after a chain of chunks, or at an offset).
#[derive(Debug, Clone)]
pub struct ChainNode {
    pub kv: BlockTable,
    /// Chunks this segment depends on: deleting one drops the segment.
    pub depends_on: Vec<String>,
    pub last_used: u64,
}

#[derive(Debug, Default)]
pub struct ChunkStore {
    pub chunks: HashMap<String, StoredChunk>,
    pub chains: HashMap<Vec<String>, ChainNode>,
    clock: u64,
    pub evictions: u64,
}

/// Something the store can give back.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    Chunk(String),
    Chain(Vec<String>),
}

impl ChunkStore {
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Pages held for chunk K/V.
    pub fn pages_held(&self) -> usize {
        let own: usize = self
            .chunks
            .values()
            .filter_map(|c| c.kv.as_ref())
            .map(|t| t.pages().len())
            .sum();
        let chains: usize = self.chains.values().map(|n| n.kv.pages().len()).sum();
        own + chains
    }

    /// Marks a chunk used now.
    pub fn touch(&mut self, id: &str) {
        let now = self.tick();
        if let Some(c) = self.chunks.get_mut(id) {
            c.last_used = now;
            c.info.last_accessed = SystemTime::now();
            c.info.access_count += 1;
        }
    }

    fn free(pool: &mut KvPool, kv: &BlockTable) {
        pool.free_all(kv.pages())
            .expect("the store holds each page of its segments once");
    }

    /// Removes a chunk, its K/V and every chain segment that depends on it.
    pub fn remove_chunk(&mut self, pool: &mut KvPool, id: &str) -> Option<StoredChunk> {
        let chunk = self.chunks.remove(id)?;
        if let Some(kv) = &chunk.kv {
            Self::free(pool, kv);
        }
        let dependent: Vec<Vec<String>> = self
            .chains
            .iter()
            .filter(|(_, n)| n.depends_on.iter().any(|d| d == id))
            .map(|(k, _)| k.clone())
            .collect();
        for key in dependent {
            self.remove_chain(pool, &key);
        }
        Some(chunk)
    }

    pub fn remove_chain(&mut self, pool: &mut KvPool, key: &[String]) {
        if let Some(node) = self.chains.remove(key) {
            Self::free(pool, &node.kv);
        }
    }

    /// Evicts least-recently-used items that are not pinned until `need_pages` more pages fit
    /// in `budget_pages` and, when `need_chunk`, one more chunk fits in `max_chunks`. Chain
    /// segments go before chunks of equal age (they can be recomputed; a chunk cannot).
    /// Returns false when that is impossible.
    pub fn make_room(
        &mut self,
        pool: &mut KvPool,
        need_pages: usize,
        budget_pages: usize,
        need_chunk: bool,
        max_chunks: usize,
        pinned: &HashSet<Item>,
    ) -> bool {
        loop {
            let pages_ok = self.pages_held() + need_pages <= budget_pages;
            let count_ok = !need_chunk || self.chunks.len() < max_chunks;
            if pages_ok && count_ok {
                return true;
            }
            // Too many chunks: any chunk may go. Too many pages: only what holds pages, and
            // chain segments (recomputable) before chunks of the same age.
            let mut candidates: Vec<(u64, u8, Item)> = Vec::new();
            if count_ok {
                candidates.extend(
                    self.chains
                        .iter()
                        .map(|(k, n)| (n.last_used, 0, Item::Chain(k.clone()))),
                );
            }
            candidates.extend(
                self.chunks
                    .iter()
                    .filter(|(_, c)| !count_ok || c.kv.is_some())
                    .map(|(k, c)| (c.last_used, 1, Item::Chunk(k.clone()))),
            );
            candidates.retain(|(_, _, item)| !pinned.contains(item));
            candidates.sort();
            let Some((_, _, victim)) = candidates.into_iter().next() else {
                return false;
            };
            match victim {
                Item::Chain(key) => self.remove_chain(pool, &key),
                Item::Chunk(id) => {
                    self.remove_chunk(pool, &id);
                }
            }
            self.evictions += 1;
        }
    }

    /// Infos of the chunks matching a type and metadata pairs, oldest first.
    pub fn list(
        &self,
        chunk_type: Option<ChunkType>,
        metadata: &[(String, String)],
    ) -> Vec<ChunkInfo> {
        let mut out: Vec<ChunkInfo> = self
            .chunks
            .values()
            .filter(|c| chunk_type.is_none_or(|t| c.info.chunk_type == t))
            .filter(|c| {
                metadata
                    .iter()
                    .all(|(k, v)| c.info.metadata.get(k) == Some(v))
            })
            .map(|c| c.info.clone())
            .collect();
        out.sort_by(|a, b| (a.created_at, &a.chunk_id).cmp(&(b.created_at, &b.chunk_id)));
        out
    }

    /// Frees every page the store holds.
    pub fn clear(&mut self, pool: &mut KvPool) {
        for c in std::mem::take(&mut self.chunks).into_values() {
            if let Some(kv) = &c.kv {
                Self::free(pool, kv);
            }
        }
        for n in std::mem::take(&mut self.chains).into_values() {
            Self::free(pool, &n.kv);
        }
    }
}

/// Metadata as given by a caller, sorted.
pub fn metadata_map<K: Into<String>, V: Into<String>>(
    pairs: impl IntoIterator<Item = (K, V)>,
) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect()
}
