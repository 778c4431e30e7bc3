//! Chapter 6.6: the scales of an FP8 K/V cache, one for K and one for V per layer (vLLM's
//! `k_scale` and `v_scale`).
//!
//! E4M3 holds magnitudes from 2^-9 to 448 only. A layer whose keys reach 1,000 would saturate,
//! one whose values stay under 0.01 would sit among the coarse subnormals; a scale moves the
//! window: the cache stores `encode(x / scale)` and attention reads `decode(code) * scale`.
//! The default is 1.0 (what vLLM uses without a quantized checkpoint); a runner may instead
//! calibrate each layer from the first prefill it computes (`amax / 448`, so that the largest
//! magnitude seen maps to the largest code). A scale, once set, never changes: the codes
//! already in the cache were written with it.

use crate::e4m3;

/// The scales of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    pub k_scale: f32,
    pub v_scale: f32,
}

impl Default for KvScales {
    fn default() -> Self {
        Self {
            k_scale: 1.0,
            v_scale: 1.0,
        }
    }
}

impl KvScales {
    /// Scales that map the largest magnitudes seen, `k_amax` and `v_amax`, to 448. A layer
    /// with nothing but zeros (or a non-finite maximum) keeps 1.0.
    pub fn from_amax(k_amax: f32, v_amax: f32) -> Self {
        let scale = |amax: f32| {
            if amax > 0.0 && amax.is_finite() {
                amax / e4m3::MAX
            } else {
                1.0
            }
        };
        Self {
            k_scale: scale(k_amax),
            v_scale: scale(v_amax),
        }
    }
}

/// `x` as an FP8 cache with `scale` stores it and gives it back: `decode(encode(x / scale)) *
/// scale`. Rounding twice changes nothing (a stored value is exactly representable), which is
/// why a runner may round a value again each time it reads it.
pub fn through_fp8(x: f32, scale: f32) -> f32 {
    e4m3::decode(e4m3::encode(x / scale)) * scale
}

/// The largest magnitude in `xs` (0 for none).
pub fn amax(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}
