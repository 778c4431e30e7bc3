//! Chapter 6.4: where the loader reads tensors from.
//!
//! The loader only asks for a tensor's shape, its stored type and a range of its elements as
//! bf16, so anything that answers those can be uploaded: a checkpoint or random weights
//! ([`phase2::Weights`]), or a view that answers with slices of another source (a
//! tensor-parallel rank's part of the model).

use half::bf16;
use kernels::random::Window;
use phase2::random_weights::{Uniform, tensor_key};
use phase2::{Dtype, Error, Weights};

/// How the device draws a random tensor in place: the whole tensor's stream and distribution,
/// the window of that stream this source's tensor holds, and how many of its leading elements
/// are drawn (the rest, padding, stays zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomDraw {
    pub key: u64,
    pub dist: Uniform,
    pub window: Window,
    pub len: usize,
}

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
    /// How tensor `name` is drawn, when [`TensorSource::random_seed`] is `Some`.
    fn random_draw(&self, name: &str) -> Result<Option<RandomDraw>, Error>;
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

    fn random_draw(&self, name: &str) -> Result<Option<RandomDraw>, Error> {
        let Some(seed) = Weights::random_seed(self) else {
            return Ok(None);
        };
        let shape = Weights::shape(self, name)?;
        let len = shape.iter().product::<usize>();
        Ok(Some(RandomDraw {
            key: tensor_key(seed, name),
            dist: Uniform::for_tensor(name, shape),
            window: Window::whole(len as u64),
            len,
        }))
    }

    fn total_bytes(&self) -> usize {
        Weights::total_bytes(self)
    }
}
