//! Chapter 2: random weights for a real architecture, generated in parallel and the same
//! everywhere.
//!
//! Benchmarks of an 8B or 32B shape need weights of the right size, not trained ones. A
//! sequential generator would walk billions of numbers on one core; here every value is a pure
//! function of `(seed, tensor name, index)` (a counter-based generator, as Salmon et al.'s
//! Philox is), so any core or GPU thread computes any element on its own. The draw is uniform
//! with the standard deviation of the usual initialisation, and uses only integer mixing and
//! exactly rounded f32 operations, so the CPU ([`fill`]) and the CUDA kernel built from the same
//! recipe write the same bf16 bits.

use half::bf16;
use rayon::prelude::*;

/// The golden-ratio increment of SplitMix64, which spaces consecutive counters apart.
pub const COUNTER_STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// SplitMix64's finaliser: a bijection on 64-bit words that scrambles every input bit.
pub fn mix64(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A tensor's stream: the seed mixed with the FNV-1a hash of its name, so a tensor's values do
/// not depend on which other tensors exist or in what order they are made.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    mix64(seed ^ mix64(fnv))
}

/// Uniform values in `mean ± half_width`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uniform {
    pub mean: f32,
    pub half_width: f32,
}

impl Uniform {
    /// The distribution of a tensor by its name and shape: matrices with standard deviation
    /// `1/sqrt(fan_in)`, norm weights near 1 (std 0.1), biases near 0 (std 0.1). A uniform
    /// draw of half-width `sqrt(3) * std` has standard deviation `std`.
    pub fn for_tensor(name: &str, shape: &[usize]) -> Self {
        let sqrt3 = 3f32.sqrt();
        if name.ends_with("norm.weight") {
            Self {
                mean: 1.0,
                half_width: 0.1 * sqrt3,
            }
        } else if shape.len() == 2 {
            Self {
                mean: 0.0,
                half_width: (3.0 / shape[1] as f32).sqrt(),
            }
        } else {
            Self {
                mean: 0.0,
                half_width: 0.1 * sqrt3,
            }
        }
    }

    /// Element `index` of the stream `key`. `u` has 24 significant bits, so `2u - 1` is exact;
    /// the one product and one sum are rounded as IEEE f32 everywhere (no fused multiply-add).
    pub fn draw(self, key: u64, index: u64) -> bf16 {
        let h = mix64(key.wrapping_add((index + 1).wrapping_mul(COUNTER_STEP)));
        let u = ((h >> 41) as f32 + 0.5) * (1.0 / (1u64 << 23) as f32);
        let x = 2.0 * u - 1.0;
        bf16::from_f32(self.mean + self.half_width * x)
    }
}

/// Fills `out` (little-endian bf16 bytes) with elements `0..out.len() / 2` of the stream, on
/// every core.
pub fn fill(out: &mut [u8], key: u64, dist: Uniform) {
    const BLOCK: usize = 1 << 16;
    out.par_chunks_mut(2 * BLOCK)
        .enumerate()
        .for_each(|(block, bytes)| {
            let first = (block * BLOCK) as u64;
            for (i, v) in bytes.chunks_exact_mut(2).enumerate() {
                v.copy_from_slice(&dist.draw(key, first + i as u64).to_le_bytes());
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_depend_on_seed_name_and_index_only() {
        let dist = Uniform::for_tensor("model.layers.0.mlp.up_proj.weight", &[8, 48]);
        let key = tensor_key(7, "model.layers.0.mlp.up_proj.weight");
        let mut whole = vec![0u8; 2 * 200_000];
        fill(&mut whole, key, dist);
        // Any element, computed alone, is the same.
        for i in [0usize, 1, 65_535, 65_536, 199_999] {
            let v = bf16::from_le_bytes([whole[2 * i], whole[2 * i + 1]]);
            assert_eq!(v, dist.draw(key, i as u64));
        }
        assert_ne!(key, tensor_key(8, "model.layers.0.mlp.up_proj.weight"));
        assert_ne!(key, tensor_key(7, "model.layers.1.mlp.up_proj.weight"));
    }

    #[test]
    fn moments_match_the_initialisation() {
        let name = "model.layers.0.self_attn.q_proj.weight";
        let dist = Uniform::for_tensor(name, &[64, 1024]);
        let key = tensor_key(0, name);
        let n = 1 << 18;
        let xs: Vec<f64> = (0..n).map(|i| dist.draw(key, i).to_f64()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
        assert!(mean.abs() < 1e-3, "mean {mean}");
        assert!((std * 32.0 - 1.0).abs() < 0.01, "std {std}, expected 1/32");
        let norm = Uniform::for_tensor("model.norm.weight", &[1024]);
        let v = norm.draw(key, 3).to_f32();
        assert!((0.82..=1.18).contains(&v), "{v}");
    }
}
