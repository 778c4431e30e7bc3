//! The crate's error type: every failure says what was asked and what to do about it.

use std::path::PathBuf;

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No GPU can be used here: the driver library is missing, or it sees no device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),

    /// A CUDA library that is loaded at run time is not on the library path.
    #[error(
        "the CUDA library `{lib}` could not be loaded; install the CUDA toolkit or add its lib64 \
         folder to LD_LIBRARY_PATH"
    )]
    MissingLibrary { lib: &'static str },

    /// NVRTC needs the toolkit's headers (cuda_bf16.h) and none were found.
    #[error(
        "CUDA headers not found: no cuda_bf16.h in {}; set CUDA_HOME (or CUDA_PATH) to the CUDA \
         toolkit folder that holds include/",
        searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    MissingHeaders { searched: Vec<PathBuf> },

    /// A kernel source did not compile; `log` is NVRTC's own report.
    #[error("NVRTC could not compile {file} for {arch} (options: {options}):\n{log}")]
    Compile {
        file: String,
        arch: String,
        options: String,
        log: String,
    },

    #[error("NVRTC: {0}")]
    Nvrtc(#[from] NvrtcError),

    #[error("CUDA driver, while {context}: {source}")]
    Driver {
        context: String,
        source: DriverError,
    },

    #[error("cuBLAS: {0:?}")]
    Cublas(#[from] CublasError),

    /// A launcher refused its arguments before touching the device.
    #[error("{kernel}: {message}")]
    InvalidArgument {
        kernel: &'static str,
        message: String,
    },

    /// A collective operation between devices (an all-reduce, an all-gather) failed; the
    /// library that ran it says why.
    #[error("{op} between devices: {message}")]
    Collective { op: &'static str, message: String },

    #[error("kernel cache {}: {source}", path.display())]
    Cache {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Attaches what was being done to a driver error.
pub(crate) trait DriverContext<T> {
    fn during(self, context: impl Into<String>) -> Result<T>;
}

impl<T> DriverContext<T> for std::result::Result<T, DriverError> {
    fn during(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|source| Error::Driver {
            context: context.into(),
            source,
        })
    }
}
