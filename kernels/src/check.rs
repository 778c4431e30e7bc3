//! Argument checks shared by the launchers: sizes are checked on the host, before any launch,
//! so a wrong shape is a clear error instead of an out-of-bounds access on the device.

use crate::error::{Error, Result};

pub(crate) fn invalid(kernel: &'static str, message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        kernel,
        message: message.into(),
    }
}

/// A buffer must hold at least `needed` elements (it may be a larger, preallocated one).
pub(crate) fn at_least(kernel: &'static str, what: &str, len: usize, needed: usize) -> Result<()> {
    if len < needed {
        return Err(invalid(
            kernel,
            format!("{what} holds {len} elements, {needed} are needed"),
        ));
    }
    Ok(())
}

/// Vector loads of 16 bytes need 16-byte aligned rows (views must start on such a boundary).
pub(crate) fn aligned(kernel: &'static str, what: &str, ptr: u64) -> Result<()> {
    if !ptr.is_multiple_of(16) {
        return Err(invalid(
            kernel,
            format!(
                "{what} must start on a 16-byte boundary (a view offset by a multiple of 8 bf16)"
            ),
        ));
    }
    Ok(())
}

/// A size passed to a kernel as a 32-bit int.
pub(crate) fn int(kernel: &'static str, what: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| invalid(kernel, format!("{what} = {value} exceeds i32")))
}

pub(crate) fn head_dim(kernel: &'static str, d: usize) -> Result<()> {
    if matches!(d, 32 | 64 | 128) {
        Ok(())
    } else {
        Err(invalid(
            kernel,
            format!("head_dim {d} is not one of 32, 64, 128"),
        ))
    }
}

pub(crate) fn multiple_of_8(kernel: &'static str, what: &str, value: usize) -> Result<()> {
    if value == 0 || !value.is_multiple_of(8) {
        return Err(invalid(
            kernel,
            format!("{what} = {value} must be a positive multiple of 8"),
        ));
    }
    Ok(())
}
