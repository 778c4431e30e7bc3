//! Chapter 6.5 on GPUs: the same split, one GPU per rank, NCCL between them.

pub mod nccl;
mod rank_model;
mod runner;
mod shard_source;

pub use rank_model::RankModel;
pub use runner::{TpCudaRunner, tp_cuda_runner};
pub use shard_source::ShardSource;
