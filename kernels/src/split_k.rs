//! Split-K for the thin products of a decode step (the K-splitting of CUTLASS's split-K GEMMs).
//!
//! A decode step multiplies one row per sequence, a few hundred at most, by each weight
//! matrix. Its output has too few tiles to keep every SM streaming weights: o_proj at 134
//! sequences is 134 x 1,024 outputs, a dozen or so cuBLAS tiles for 132 SMs. Cutting the inner
//! dimension K into S ranges and running one GEMM per range, as one strided-batched cuBLAS
//! call, makes S times the tiles; each range writes f32 partial sums
//! `partials[s] = x[:, range s] · w[:, range s]^T`, `[tokens, out_features]` each. The partials
//! are small enough to stay in L2, and the next kernel adds them as it reads its input
//! ([`crate::norm::add_split_rms_norm`] in the engine; [`sum_splits`] for any other consumer).

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{DevicePtr, DevicePtrMut, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// The most K ranges a product is cut into.
pub const MAX_SPLITS: usize = 16;

/// Output elements a split-K product aims at, all its ranges together (see [`num_splits`]).
const TARGET_OUTPUTS: usize = 768 * 1024;

/// How many K ranges to cut `rows x out_features x in_features` into: the power of two that
/// brings the output elements of all ranges together closest below `TARGET_OUTPUTS`, at most
/// 8 and with ranges of a multiple of 8 elements; 1 (no split) for a product with that many
/// outputs already. The partials of a split never exceed that size (3 MiB of f32).
///
/// Measured on an H100 (`cargo bench -p kernels --bench gemm`, 28 layers' weights in a CUDA
/// graph) for Qwen3-0.6B's o_proj (1,024 x 2,048) and down (1,024 x 3,072): 1.3-1.6x faster
/// at 1-256 rows (at 128 rows 5.6 -> 4.3 and 7.4 -> 5.0 us). Products with 4,096 or more
/// outputs a row (q/k/v, gate/up) gain nothing or lose even at one row, so the runner splits
/// only the two whose next kernel, add + RMSNorm, sums the partials as it reads them.
pub fn num_splits(rows: usize, out_features: usize, in_features: usize) -> usize {
    let outputs = rows * out_features;
    if outputs == 0 || outputs * 2 > TARGET_OUTPUTS {
        return 1;
    }
    let mut splits = 1usize << (TARGET_OUTPUTS / outputs).min(MAX_SPLITS / 2).ilog2();
    while splits > 1 && !in_features.is_multiple_of(8 * splits) {
        splits /= 2;
    }
    splits
}

/// The most floats the partials of a product that [`num_splits`] splits take, whatever its
/// rows: what a caller allocates once.
pub const MAX_PARTIALS: usize = TARGET_OUTPUTS;

/// Checks a split-K product's partials buffer and returns the floats between two splits.
pub(crate) fn check_partials(
    kernel: &'static str,
    len: usize,
    rows: usize,
    width: usize,
    splits: usize,
) -> Result<usize> {
    if splits == 0 || splits > MAX_SPLITS {
        return Err(check::invalid(
            kernel,
            format!("{splits} splits (1 to {MAX_SPLITS})"),
        ));
    }
    check::at_least(kernel, "partials", len, splits * rows * width)?;
    Ok(rows * width)
}

/// `partials: f32[splits, tokens, out_features]`, split `s` the product of x and w over the
/// `s`-th of `splits` equal ranges of `in_features` (which must cut into ranges of a multiple
/// of 8). `x: bf16[tokens, in_features]`, `w: bf16[out_features, in_features]`.
#[allow(clippy::too_many_arguments)]
pub fn linear_partials(
    gpu: &Gpu,
    x: &impl DevicePtr<bf16>,
    w: &impl DevicePtr<bf16>,
    partials: &mut impl DevicePtrMut<f32>,
    tokens: usize,
    out_features: usize,
    in_features: usize,
    splits: usize,
) -> Result<()> {
    const K: &str = "linear_partials";
    check_partials(K, partials.len(), tokens, out_features, splits)?;
    check::at_least(K, "x", x.len(), tokens * in_features)?;
    check::at_least(K, "weight", w.len(), out_features * in_features)?;
    if !in_features.is_multiple_of(8 * splits) {
        return Err(check::invalid(
            K,
            format!(
                "in_features {in_features} does not cut into {splits} ranges of a multiple of 8"
            ),
        ));
    }
    if tokens == 0 || out_features == 0 {
        return Ok(());
    }
    // Column-major, as in `linear::default_gemm`: partial^T = op(w range) · (x range)^T. Batch
    // s starts `range` elements further into each row of w and x, and one output further.
    let range = in_features / splits;
    let (m, n, k) = (
        check::int(K, "out_features", out_features)?,
        check::int(K, "tokens", tokens)?,
        check::int(K, "in_features", range)?,
    );
    let ld = check::int(K, "in_features", in_features)?;
    let (pw, px, pp) = (gpu.ptr(w), gpu.ptr(x), gpu.ptr_mut(partials));
    let (alpha, beta) = (1.0f32, 0.0f32);
    unsafe {
        blas::gemm_strided_batched_ex(
            *gpu.blas().handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha as *const f32).cast(),
            pw as *const _,
            blas_sys::cudaDataType::CUDA_R_16BF,
            ld,
            range as i64,
            px as *const _,
            blas_sys::cudaDataType::CUDA_R_16BF,
            ld,
            range as i64,
            (&beta as *const f32).cast(),
            pp as *mut _,
            blas_sys::cudaDataType::CUDA_R_32F,
            m,
            (tokens * out_features) as i64,
            splits as i32,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}

/// `out: bf16[rows, width]` = the sum of the `splits` partials of a split-K product, rounded
/// once (what the plain bf16 product would hold, up to the order of the f32 sums).
pub fn sum_splits(
    gpu: &Gpu,
    partials: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<bf16>,
    rows: usize,
    width: usize,
    splits: usize,
) -> Result<()> {
    const K: &str = "sum_splits";
    check::multiple_of_8(K, "width", width)?;
    let stride = check_partials(K, partials.len(), rows, width, splits)?;
    check::at_least(K, "output", out.len(), rows * width)?;
    if rows == 0 {
        return Ok(());
    }
    let (pp, po) = (gpu.ptr(partials), gpu.ptr_mut(out));
    check::aligned(K, "partials", pp)?;
    check::aligned(K, "output", po)?;
    let f = gpu.function(Source::SplitK, "sum_splits")?;
    let chunks = (rows * width / 8) as i64;
    let blocks = (chunks as usize).div_ceil(256).min(gpu.num_sms() * 8) as u32;
    let (splits_arg, stride_arg) = (splits as i32, stride as i64);
    let mut launch = gpu.stream().launch_builder(&f);
    launch
        .arg(&pp)
        .arg(&po)
        .arg(&splits_arg)
        .arg(&stride_arg)
        .arg(&chunks);
    unsafe { launch.launch(grid((blocks, 1, 1), 256)) }.during(K)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fit_the_partials_buffer_and_cut_k_evenly() {
        for out in [256, 1024, 2048, 4096, 151_936] {
            for inp in [256, 1000, 1024, 2048, 3072] {
                for rows in [0, 1, 7, 64, 100, 128, 256, 1000, 16_384] {
                    let s = num_splits(rows, out, inp);
                    assert!((1..=MAX_SPLITS).contains(&s), "{rows}x{out}x{inp}: {s}");
                    assert!(s.is_power_of_two());
                    assert!(
                        s == 1 || inp.is_multiple_of(8 * s),
                        "{rows}x{out}x{inp}: {s}"
                    );
                    assert!(
                        s == 1 || s * rows * out <= MAX_PARTIALS,
                        "{rows}x{out}x{inp}: {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn thin_products_split_and_wide_ones_do_not() {
        // Qwen3-0.6B's o_proj and down, as measured on the H100.
        assert_eq!(num_splits(1, 1024, 2048), 8);
        assert_eq!(num_splits(128, 1024, 3072), 4);
        assert_eq!(num_splits(256, 1024, 2048), 2);
        assert_eq!(num_splits(512, 1024, 2048), 1);
        // A prefill step.
        assert_eq!(num_splits(16_384, 1024, 2048), 1);
    }
}
