//! A model at a shape no fixture has, shared by the GPU tests of this crate and of chapter 6.6
//! (`phase6-engine/fp8/tests/cuda_fp8.rs` includes this file).

use phase2::{ModelConfig, Weights, models_dir};

/// Tiny Shakespeare's config at head_dim 128 with random weights (seed 7). The fixtures' heads
/// are 32 or 64 wide; Qwen3's 128 is the size the Hopper kernels serve (the warp-specialized
/// prefill, the FP8 decode through bulk copies).
pub fn tiny_shakespeare_head_dim_128() -> (ModelConfig, Weights) {
    let path = models_dir().join("tiny-shakespeare/config.json");
    let json = std::fs::read_to_string(&path).unwrap();
    let json = json.replace("\"head_dim\": 64", "\"head_dim\": 128");
    let config = ModelConfig::from_json(&json, &path).unwrap();
    assert_eq!(config.head_dim, 128);
    let weights = Weights::random(&config, 7);
    (config, weights)
}
