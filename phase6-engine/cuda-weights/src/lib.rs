//! Chapter 6.4's weights on the device: every tensor the CUDA runner multiplies by, in bf16,
//! loaded from a [`TensorSource`] (a checkpoint, random weights, or in chapter 6.5 one rank's
//! slices of them) through a ring of pinned buffers.

mod device_weights;
mod errors;
mod source;

pub use device_weights::{DeviceWeights, LayerWeights};
pub use errors::{device_error, driver_error};
pub use source::{RandomDraw, TensorSource};
