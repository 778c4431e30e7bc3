//! Chapter 1: the paged KV pool.
//!
//! Every token a model has seen leaves a key and a value vector in every layer: the KV cache.
//! Reserving one contiguous buffer per request for its longest possible length wastes most
//! of the memory, so vLLM's PagedAttention cuts KV memory into fixed-size *pages* (blocks) of
//! `page_size` tokens and gives each sequence a [`BlockTable`] that lists its pages, the way an
//! operating system maps virtual pages to physical frames.
//!
//! This crate is the bookkeeping only: a [`KvPool`] hands out page ids and counts how many
//! holders each page has; it never touches K/V numbers (those live in the model runner,
//! indexed by page id). Pages whose content is a full page of a known prefix can be found
//! again through a chain hash ([`PageHash`]), so identical prompt prefixes share pages.

mod block_table;
mod error;
#[cfg(feature = "exercises")]
pub mod exercises;
mod free_queue;
mod kv_layout;
mod kv_pool;
mod prefix_hash;

pub use block_table::{BlockTable, Slot};
pub use error::Error;
pub use free_queue::FreeQueue;
pub use kv_layout::{KvDtype, KvLayout};
pub use kv_pool::{KvPool, PageId};
pub use prefix_hash::{PageHash, prefix_hashes};
