//! Chapter 6.4: device failures as the runner trait reports them.

use phase2::Error;

/// A device failure as the runner trait reports it.
pub fn device_error(e: kernels::Error) -> Error {
    Error::Device(e.to_string())
}

/// A driver call's failure, said with what it was doing.
pub fn driver_error(context: &str, source: kernels::DriverError) -> Error {
    device_error(kernels::Error::Driver {
        context: context.into(),
        source,
    })
}
