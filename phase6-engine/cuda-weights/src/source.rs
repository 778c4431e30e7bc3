//! Chapter 6.4: where the loader reads tensors from.
//!
//! The loader only asks for a tensor's shape, its stored type and a range of its elements as
//! bf16, so anything that answers those can be uploaded: a checkpoint or random weights
//! ([`phase2::Weights`]), or a view that answers with slices of another source (a
//! tensor-parallel rank's part of the model).

use half::bf16;
use phase2::{Dtype, Error, Weights};

/// Named tensors the loader can read.
pub trait TensorSource: Sync {
    fn shape(&self, name: &str) -> Result<Vec<usize>, Error>;
    /// The number type as stored (what the progress bar counts bytes in).
    fn dtype(&self, name: &str) -> Result<Dtype, Error>;
    fn contains(&self, name: &str) -> bool;
    /// Elements `start..start + out.len()` of tensor `name`, rounded to bf16.
    fn read_bf16(&self, name: &str, start: usize, out: &mut [bf16]) -> Result<(), Error>;
    /// `Some(seed)` when every tensor is `phase2::random_weights`' draw from `seed`, which the
    /// device can make in place instead of reading.
    fn random_seed(&self) -> Option<u64>;
    /// Bytes of every tensor, as stored.
    fn total_bytes(&self) -> usize;
}

impl TensorSource for Weights {
    fn shape(&self, name: &str) -> Result<Vec<usize>, Error> {
        Weights::shape(self, name).map(<[usize]>::to_vec)
    }

    fn dtype(&self, name: &str) -> Result<Dtype, Error> {
        self.tensor_dtype(name)
    }

    fn contains(&self, name: &str) -> bool {
        Weights::contains(self, name)
    }

    fn read_bf16(&self, name: &str, start: usize, out: &mut [bf16]) -> Result<(), Error> {
        Weights::read_bf16(self, name, start, out)
    }

    fn random_seed(&self) -> Option<u64> {
        Weights::random_seed(self)
    }

    fn total_bytes(&self) -> usize {
        Weights::total_bytes(self)
    }
}
