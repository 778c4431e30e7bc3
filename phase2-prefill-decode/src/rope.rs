//! Chapter 2: the rotary position embedding's frequencies, and how long-context models rescale
//! them.
//!
//! RoPE (Su et al., RoFormer) turns pair `i` of every query and key head by the angle
//! `position * inv_freq[i]`, with `inv_freq[i] = theta^(-2i / head_dim)`. A model trained on
//! contexts of `original_max_position_embeddings` tokens has never seen the slow pairs turn
//! further than that; to serve longer contexts, its config rescales the frequencies, as
//! `transformers`' `modeling_rope_utils` defines:
//!
//! - `linear` (position interpolation, Chen et al. 2023): every frequency divided by `factor`.
//! - `llama3` (Llama 3.1-3.3): pairs whose wavelength is longer than the original context are
//!   divided by `factor`, those shorter than a quarter of it (`high_freq_factor`) are kept, and
//!   the band between is blended smoothly.
//! - `yarn` (Peng et al., YaRN): the same three bands, cut by how many turns a pair makes over the
//!   original context (`beta_fast`, `beta_slow`), plus an attention factor applied to cos and sin
//!   that sharpens the softmax again (`0.1 ln(factor) + 1`).
//!
//! The table is computed once, on the host, when the config is read; the CPU forward pass and the
//! CUDA kernels both rotate by it, so no kernel recomputes `theta^(-2i/d)`.

use std::f64::consts::PI;

use serde_json::Value;

/// How a config rescales the RoPE frequencies.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `theta^(-2i/d)` as trained.
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1's banded scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: banded interpolation plus an attention factor on cos/sin.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        attention_factor: f64,
        truncate: bool,
    },
}

/// The rope types this crate computes, for error messages.
pub const SUPPORTED_ROPE_TYPES: &str = "default, linear, llama3, yarn";

impl RopeScaling {
    /// Reads a `rope_scaling` or `rope_parameters` object (`type` or `rope_type` names the kind;
    /// `rope_theta` inside it is ignored here). `max_position_embeddings` stands in for a missing
    /// `original_max_position_embeddings`, as in `transformers`.
    pub fn from_json(value: &Value, max_position_embeddings: usize) -> Result<Self, String> {
        let Some(obj) = value.as_object() else {
            return Err(format!("rope scaling {value} is not an object"));
        };
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let num = |key: &str| obj.get(key).and_then(Value::as_f64);
        let need = |key: &str| {
            num(key).ok_or_else(|| format!("rope type {kind:?} needs a number {key:?}"))
        };
        let original =
            num("original_max_position_embeddings").unwrap_or(max_position_embeddings as f64);
        let scaling = match kind {
            "default" => Self::None,
            "linear" => Self::Linear {
                factor: need("factor")?,
            },
            "llama3" => Self::Llama3 {
                factor: need("factor")?,
                low_freq_factor: need("low_freq_factor")?,
                high_freq_factor: need("high_freq_factor")?,
                original_max_position_embeddings: need("original_max_position_embeddings")?,
            },
            "yarn" => {
                let factor = need("factor")?;
                let mscale = |m: f64| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                let attention_factor = match (
                    num("attention_factor"),
                    num("mscale"),
                    num("mscale_all_dim"),
                ) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                    _ => mscale(1.0),
                };
                Self::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: num("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
                    beta_slow: num("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
                    attention_factor,
                    truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                }
            }
            other => {
                return Err(format!(
                    "rope type {other:?} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
                ));
            }
        };
        let factor = match &scaling {
            Self::None => 1.0,
            Self::Linear { factor } | Self::Llama3 { factor, .. } | Self::Yarn { factor, .. } => {
                *factor
            }
        };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(format!(
                "rope type {kind:?}: factor {factor} must be positive"
            ));
        }
        Ok(scaling)
    }
}

/// The rotation of one model: `inv_freq[i]` for each pair of a head, and the factor cos and sin
/// are multiplied by (1 unless YaRN).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeFrequencies {
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

impl RopeFrequencies {
    /// The table of a head of `head_dim` (even) for base `theta`, rescaled by `scaling`.
    pub fn new(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Self {
        let dim = head_dim as f64;
        let base: Vec<f64> = (0..head_dim / 2)
            .map(|i| theta.powf(-((2 * i) as f64) / dim))
            .collect();
        let mut attention_factor = 1.0;
        let inv_freq: Vec<f64> = match *scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: context,
            } => {
                let (long, short) = (context / low_freq_factor, context / high_freq_factor);
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < short {
                            f
                        } else if wavelen > long {
                            f / factor
                        } else {
                            let smooth = (context / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: context,
                beta_fast,
                beta_slow,
                attention_factor: a,
                truncate,
            } => {
                attention_factor = a;
                // The pair index at which a frequency makes `turns` full turns over the context.
                let pair_at =
                    |turns: f64| dim * (context / (turns * 2.0 * PI)).ln() / (2.0 * theta.ln());
                let (mut low, mut high) = (pair_at(beta_fast), pair_at(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        // 1 for the fast pairs (kept), 0 for the slow ones (interpolated).
                        let keep = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        f / factor * (1.0 - keep) + f * keep
                    })
                    .collect()
            }
        };
        Self {
            inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(),
            attention_factor: attention_factor as f32,
        }
    }

    /// cos and sin of every pair's angle for each position, times the attention factor:
    /// `[positions][head_dim / 2]` each. The angle is the f32 product `position * inv_freq`, as
    /// `transformers` and the CUDA kernel compute it.
    pub fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        self.tables_scaled(positions.iter().map(|&p| p as f32), self.attention_factor)
    }

    /// cos and sin of a pure rotation by `shift` positions (no attention factor): what turns a
    /// key cached at position `p` into the key at `p + shift`.
    pub fn shift_tables(&self, shift: i64) -> (Vec<f32>, Vec<f32>) {
        self.tables_scaled(std::iter::once(shift as f32), 1.0)
    }

    fn tables_scaled(
        &self,
        positions: impl Iterator<Item = f32>,
        scale: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            for &f in &self.inv_freq {
                let angle = (p * f) as f64;
                cos.push(angle.cos() as f32 * scale);
                sin.push(angle.sin() as f32 * scale);
            }
        }
        (cos, sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn freqs(scaling: Value, head_dim: usize, theta: f64) -> RopeFrequencies {
        let s = RopeScaling::from_json(&scaling, 131_072).unwrap();
        RopeFrequencies::new(head_dim, theta, &s)
    }

    #[test]
    fn default_is_theta_to_the_minus_two_i_over_d() {
        let f = freqs(json!({"rope_type": "default"}), 8, 10_000.0);
        assert_eq!(f.inv_freq, vec![1.0, 0.1, 0.01, 0.001]);
        assert_eq!(f.attention_factor, 1.0);
    }

    #[test]
    fn linear_divides_every_frequency() {
        let f = freqs(json!({"type": "linear", "factor": 4.0}), 8, 10_000.0);
        assert_eq!(f.inv_freq, vec![0.25, 0.025, 0.0025, 0.00025]);
    }

    #[test]
    fn llama3_keeps_fast_pairs_divides_slow_ones_and_blends_between() {
        // Llama 3.1 8B: head_dim 128, theta 5e5, factor 8, original context 8192.
        let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let scaled = freqs(scaling, 128, 500_000.0);
        let plain = freqs(json!({}), 128, 500_000.0);
        for (i, (&s, &p)) in scaled.inv_freq.iter().zip(&plain.inv_freq).enumerate() {
            let wavelen = 2.0 * PI / p as f64;
            if wavelen < 2048.0 {
                assert_eq!(s, p, "pair {i}");
            } else if wavelen > 8192.0 {
                assert!((s - p / 8.0).abs() <= p * 1e-6, "pair {i}");
            } else {
                assert!(s < p && s > p / 8.0, "pair {i}: {s} between {p}/8 and {p}");
            }
        }
    }

    #[test]
    fn yarn_attention_factor_and_bands() {
        // Qwen3's long-context setting: factor 4 over 32,768 positions.
        let scaling = json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 32768});
        let scaled = freqs(scaling, 128, 1_000_000.0);
        let plain = freqs(json!({}), 128, 1_000_000.0);
        let expected = (0.1 * 4f64.ln() + 1.0) as f32;
        assert!((scaled.attention_factor - expected).abs() < 1e-7);
        assert_eq!(
            scaled.inv_freq[0], plain.inv_freq[0],
            "the fastest pair is kept"
        );
        let last = plain.inv_freq.len() - 1;
        assert!((scaled.inv_freq[last] - plain.inv_freq[last] / 4.0).abs() < 1e-12);
        let mscaled = json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096});
        assert_eq!(freqs(mscaled, 64, 10_000.0).attention_factor, 1.0);
    }

    #[test]
    fn unknown_and_malformed_types_are_named() {
        let err =
            RopeScaling::from_json(&json!({"type": "dynamic", "factor": 2.0}), 10).unwrap_err();
        assert_eq!(
            err,
            "rope type \"dynamic\" is not supported (supported: default, linear, llama3, yarn)"
        );
        let err =
            RopeScaling::from_json(&json!({"rope_type": "llama3", "factor": 8.0}), 10).unwrap_err();
        assert!(err.contains("needs a number \"low_freq_factor\""), "{err}");
        let err =
            RopeScaling::from_json(&json!({"rope_type": "linear", "factor": 0}), 10).unwrap_err();
        assert!(err.contains("must be positive"), "{err}");
    }

    #[test]
    fn shift_tables_compose_with_position_tables() {
        let f = freqs(
            json!({"rope_type": "yarn", "factor": 2.0,
            "original_max_position_embeddings": 64}),
            16,
            10_000.0,
        );
        let (c5, s5) = f.tables(&[5]);
        let (c3, s3) = f.tables(&[3]);
        let (cs, ss) = f.shift_tables(2);
        let a2 = f.attention_factor * f.attention_factor;
        for i in 0..8 {
            // Rotating the angle of position 3 by 2 gives the angle of position 5.
            let c = (c3[i] * cs[i] - s3[i] * ss[i]) / f.attention_factor;
            let s = (s3[i] * cs[i] + c3[i] * ss[i]) / f.attention_factor;
            assert!((c * f.attention_factor - c5[i]).abs() < 1e-5 * a2.max(1.0));
            assert!((s * f.attention_factor - s5[i]).abs() < 1e-5 * a2.max(1.0));
        }
    }
}
