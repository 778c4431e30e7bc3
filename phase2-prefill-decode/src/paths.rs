//! Where the repository's models live.
//!
//! The embedded default model sits in `models/tiny-shakespeare/` at the top of the repository.
//! `NANO_SERVING_MODELS` overrides the folder (tests on another machine, an installed binary).

use std::path::PathBuf;

/// The `models/` folder: `$NANO_SERVING_MODELS`, or the repository's own.
pub fn models_dir() -> PathBuf {
    std::env::var_os("NANO_SERVING_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models");
            dir.canonicalize().unwrap_or(dir)
        })
}

/// The embedded default model's folder.
pub fn default_model_dir() -> PathBuf {
    models_dir().join("tiny-shakespeare")
}
