//! The arithmetic of a transformer layer on the CPU, in f32.
//!
//! Linear layers are matrix products through the `gemm` crate (the blocked, vectorised GEMM
//! that candle uses); the rest is row-wise: RMSNorm (Zhang & Sennrich), rotary position
//! embeddings (RoFormer, in the Hugging Face "rotate half" layout), and SwiGLU's SiLU-and-
//! multiply (Shazeer).

/// `y[rows, out] = x[rows, in] · w[out, in]ᵀ`: a linear layer with weights stored the way
/// safetensors stores them (one row per output feature).
pub fn matmul(
    x: &[f32],
    w: &[f32],
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> Vec<f32> {
    assert_eq!(x.len(), rows * in_features, "input shape");
    assert_eq!(w.len(), out_features * in_features, "weight shape");
    let mut y = vec![0.0f32; rows * out_features];
    if rows == 0 {
        return y;
    }
    let threads = rayon::current_num_threads();
    let parallelism = if rows >= 32 && rows * in_features * out_features >= 1 << 20 && threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the pointers and strides describe exactly the three buffers above: y is
    // rows x out (row-major), x is rows x in (row-major) and w read as an in x out matrix
    // through swapped strides; all lengths were checked.
    unsafe {
        gemm::gemm(
            rows,
            out_features,
            in_features,
            y.as_mut_ptr(),
            1,
            out_features as isize,
            false,
            x.as_ptr(),
            1,
            in_features as isize,
            w.as_ptr(),
            in_features as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
    y
}

/// Dot product with eight independent partial sums, which the compiler turns into SIMD
/// (a single running sum is a dependency chain it may not reorder).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// RMSNorm of each `weight.len()`-wide row of `x`, in place.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    // BEGIN SOLUTION
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v *= scale * w;
        }
    }
    // END SOLUTION
}

/// Rotates one head vector by its position's angles: pairs `(i, i + d/2)` turn by angle `i`.
pub fn apply_rope(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    // BEGIN SOLUTION
    let half = head.len() / 2;
    for i in 0..half {
        let (a, b) = (head[i], head[i + half]);
        head[i] = a * cos[i] - b * sin[i];
        head[i + half] = b * cos[i] + a * sin[i];
    }
    // END SOLUTION
}

/// SwiGLU: each row of `gate_up` is `[gate | up]`; returns `silu(gate) * up`.
pub fn silu_mul(gate_up: &[f32], intermediate: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * intermediate) {
        let (gate, up) = row.split_at(intermediate);
        out.extend(
            gate.iter()
                .zip(up)
                .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_the_definition() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2 x 3
        let w = [1.0, 0.0, -1.0, 0.5, 0.5, 0.5]; // 2 outputs x 3 inputs
        assert_eq!(matmul(&x, &w, 2, 3, 2), vec![-2.0, 3.0, -2.0, 7.5]);
    }

    #[test]
    fn rms_norm_makes_unit_rms() {
        let mut x = [3.0, 4.0];
        rms_norm(&mut x, &[1.0, 2.0], 0.0);
        let rms = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / rms).abs() < 1e-6 && (x[1] - 8.0 / rms).abs() < 1e-6);
    }

    #[test]
    fn rope_is_a_rotation_and_position_zero_is_identity() {
        let rope = crate::RopeFrequencies::new(4, 10_000.0, &crate::RopeScaling::None);
        let (cos, sin) = rope.tables(&[0, 7]);
        let mut v = [1.0, 2.0, 3.0, 4.0];
        apply_rope(&mut v, &cos[..2], &sin[..2]);
        assert_eq!(v, [1.0, 2.0, 3.0, 4.0]);
        apply_rope(&mut v, &cos[2..], &sin[2..]);
        let norm: f32 = v.iter().map(|x| x * x).sum();
        assert!((norm - 30.0).abs() < 1e-4, "rotation keeps the length");
    }

    #[test]
    fn silu_mul_rows() {
        let out = silu_mul(&[0.0, 1.0, 2.0, 3.0], 1);
        assert_eq!(out[0], 0.0);
        assert!((out[1] - 2.0 / (1.0 + (-2.0f32).exp()) * 3.0).abs() < 1e-6);
    }
}
