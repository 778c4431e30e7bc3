//! The vocabulary of the chunk API: chunk types and records, the configuration, compositions,
//! and what a generation from chunks returns.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use phase0::{FinishReason, TokenId};
use phase1::BlockTable;

use phase6::Config;
use phase6::Error;

/// The role a piece of context plays in a composition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChunkType {
    SystemPrompt,
    Context,
    Query,
}

impl ChunkType {
    pub fn as_str(self) -> &'static str {
        match self {
            ChunkType::SystemPrompt => "system",
            ChunkType::Context => "context",
            ChunkType::Query => "query",
        }
    }
}

impl fmt::Display for ChunkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ChunkType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "system" | "system_prompt" => Ok(ChunkType::SystemPrompt),
            "context" => Ok(ChunkType::Context),
            "query" => Ok(ChunkType::Query),
            other => Err(Error::IncompatibleChunks(format!(
                "unknown chunk type {other:?} (system, context or query)"
            ))),
        }
    }
}

/// How compositions reuse K/V (docs/ARCHITECTURE.md, "The chunk API").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompositionMode {
    /// Output identical to plain generation of the same tokens: each context's K/V is computed
    /// after what precedes it, once per chain, and cached.
    #[default]
    Exact,
    /// Every chunk's K/V is computed once on its own and reused in any composition, its keys
    /// turned to their new positions; the cross-chunk attention inside it is approximated.
    Independent,
}

/// Settings of the chunk API, with the reference defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkConfig {
    pub max_chunks: usize,
    /// Fraction of the KV pages chunk K/V may hold.
    pub chunk_memory_ratio: f32,
    /// Registering the same type and content again returns the existing chunk.
    pub enable_deduplication: bool,
    pub mode: CompositionMode,
    /// The engine underneath.
    pub engine: Config,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        Self {
            max_chunks: 1000,
            chunk_memory_ratio: 0.5,
            enable_deduplication: true,
            mode: CompositionMode::Exact,
            engine: Config::default(),
        }
    }
}

/// What `list_chunks` shows of a chunk.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkInfo {
    pub chunk_id: String,
    pub chunk_type: ChunkType,
    /// The first 80 characters of the content.
    pub content_preview: String,
    pub token_count: usize,
    pub metadata: BTreeMap<String, String>,
    pub created_at: SystemTime,
    pub last_accessed: SystemTime,
    pub access_count: u64,
}

/// A chunk with its full content.
#[derive(Debug, Clone, PartialEq)]
pub struct Chunk {
    pub info: ChunkInfo,
    pub content: String,
}

/// Which chunks `list_chunks` returns: all of a type, and those whose metadata has every pair.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkFilter {
    pub chunk_type: Option<ChunkType>,
    pub metadata: Vec<(String, String)>,
}

/// One request built from chunks: exactly one system prompt, contexts, exactly one query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Composition {
    pub system_id: String,
    pub context_ids: Vec<String>,
    pub query_id: String,
}

impl Composition {
    pub fn new(system_id: &str, context_ids: &[&str], query_id: &str) -> Self {
        Self {
            system_id: system_id.to_string(),
            context_ids: context_ids.iter().map(|s| s.to_string()).collect(),
            query_id: query_id.to_string(),
        }
    }
}

/// What a composition would cost before running it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompositionPreview {
    pub total_tokens: usize,
    /// Attention levels: the system prompt, each context, and the request's own tokens.
    pub num_levels: usize,
    /// KV bytes of the whole composed sequence.
    pub memory_bytes: usize,
    /// Parts whose K/V is ready (chunk ids, in order).
    pub cached: Vec<String>,
    /// Parts that must be computed first.
    pub to_compute: Vec<String>,
}

/// The result of a generation from chunks or from KV blocks.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkOutput {
    pub text: String,
    pub token_ids: Vec<TokenId>,
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from chunks or blocks (not computed for this request).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The chunks used (`ChunkedLLM::generate` registers its texts as chunks).
    pub chunk_ids: Vec<String>,
}

/// Counters of the chunk store.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChunkStats {
    pub total_chunks: usize,
    pub memory_used_mb: f64,
    pub memory_budget_mb: f64,
    /// Composition parts (system prompts, contexts) found with their K/V ready.
    pub cache_hits: u64,
    /// Parts whose K/V had to be computed.
    pub cache_misses: u64,
    pub hit_rate: f64,
    pub evictions: u64,
}

/// Existing K/V to run new tokens on (direct inference from KV blocks): segments of pages and
/// the tokens they hold. Tokens past the K/V (the last sampled one of a conversation) are
/// computed by the next request.
#[derive(Debug, Clone, PartialEq)]
pub struct KvBlocks {
    pub segments: Vec<BlockTable>,
    pub tokens: Vec<TokenId>,
}

impl KvBlocks {
    /// Tokens that have K/V in the segments.
    pub fn num_kv_tokens(&self) -> usize {
        self.segments.iter().map(BlockTable::num_tokens).sum()
    }

    pub fn num_pages(&self) -> usize {
        self.segments.iter().map(|s| s.pages().len()).sum()
    }
}
