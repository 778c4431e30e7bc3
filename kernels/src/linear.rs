//! Linear layers through cuBLAS, and the weight fusion that makes one GEMM of several.
//!
//! `Y[T, out] = X[T, in] · W^T` with W stored `[out, in]` row-major, as in safetensors. cuBLAS
//! is column-major, where the same bytes are `W^T [in, out]` and `X^T [in, T]`; so it is asked
//! for `Y^T = op(W) · X^T` with `op = transpose`, which lands in memory as row-major Y. bf16
//! inputs, f32 accumulation (`CUBLAS_COMPUTE_32F`), bf16 or f32 output.
//!
//! q, k and v (and gate and up) read the same input: stacking their weights row-wise at load
//! time turns three GEMMs into one larger, more efficient one.

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use half::bf16;

use crate::check;
use crate::device::{Gpu, grid};
use crate::error::{DriverContext, Result};
use crate::source::Source;

/// Output element types of [`linear`].
pub trait GemmOutput: DeviceRepr + Default + Copy {
    const TYPE: blas_sys::cudaDataType;
    fn to_f32(self) -> f32;
}

impl GemmOutput for bf16 {
    const TYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_16BF;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

impl GemmOutput for f32 {
    const TYPE: blas_sys::cudaDataType = blas_sys::cudaDataType::CUDA_R_32F;
    fn to_f32(self) -> f32 {
        self
    }
}

/// `y: [tokens, out_features] = x: bf16[tokens, in_features] · w^T`, `w: bf16[out_features,
/// in_features]`, through cuBLAS's default algorithm.
pub fn linear<T: GemmOutput>(
    gpu: &Gpu,
    x: &impl DevicePtr<bf16>,
    w: &impl DevicePtr<bf16>,
    y: &mut impl DevicePtrMut<T>,
    tokens: usize,
    out_features: usize,
    in_features: usize,
) -> Result<()> {
    const K: &str = "linear";
    check::at_least(K, "x", x.len(), tokens * in_features)?;
    check::at_least(K, "weight", w.len(), out_features * in_features)?;
    check::at_least(K, "y", y.len(), tokens * out_features)?;
    if tokens == 0 || out_features == 0 {
        return Ok(());
    }
    let shape = GemmShape {
        tokens,
        out_features,
        in_features,
    };
    let ptrs = (gpu.ptr(w), gpu.ptr(x), gpu.ptr_mut(y));
    default_gemm::<T>(gpu, ptrs, &shape)
}

/// A product `y[tokens, out_features] = x[tokens, in_features] · w^T`.
struct GemmShape {
    tokens: usize,
    out_features: usize,
    in_features: usize,
}

/// The product through cuBLAS's default algorithm; `(w, x, y)` are device addresses of
/// buffers the caller checked against `shape`.
fn default_gemm<T: GemmOutput>(
    gpu: &Gpu,
    (pw, px, py): (u64, u64, u64),
    shape: &GemmShape,
) -> Result<()> {
    const K: &str = "linear";
    let (m, n, k) = (
        check::int(K, "out_features", shape.out_features)?,
        check::int(K, "tokens", shape.tokens)?,
        check::int(K, "in_features", shape.in_features)?,
    );
    let (alpha, beta) = (1.0f32, 0.0f32);
    unsafe {
        blas::gemm_ex(
            *gpu.blas().handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha as *const f32).cast(),
            pw as *const _,
            blas_sys::cudaDataType::CUDA_R_16BF,
            k,
            px as *const _,
            blas_sys::cudaDataType::CUDA_R_16BF,
            k,
            (&beta as *const f32).cast(),
            py as *mut _,
            T::TYPE,
            m,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}

/// `y[r, :] += bias` for `rows` rows: the bias of a linear layer (Qwen2's q/k/v), which the
/// GEMM above leaves out. `y: bf16[rows, width]`, `bias: bf16[width]`.
pub fn add_bias(
    gpu: &Gpu,
    y: &mut impl DevicePtrMut<bf16>,
    bias: &impl DevicePtr<bf16>,
    rows: usize,
    width: usize,
) -> Result<()> {
    const K: &str = "add_bias";
    check::multiple_of_8(K, "width", width)?;
    check::at_least(K, "y", y.len(), rows * width)?;
    check::at_least(K, "bias", bias.len(), width)?;
    if rows == 0 {
        return Ok(());
    }
    let (py, pb) = (gpu.ptr_mut(y), gpu.ptr(bias));
    check::aligned(K, "y", py)?;
    check::aligned(K, "bias", pb)?;
    let f = gpu.function(Source::Bias, "add_bias")?;
    let blocks = (rows * width / 8).div_ceil(256).min(gpu.num_sms() * 8) as u32;
    let (rows_arg, width_arg) = (check::int(K, "rows", rows)?, check::int(K, "width", width)?);
    let mut launch = gpu.stream().launch_builder(&f);
    launch.arg(&py).arg(&pb).arg(&rows_arg).arg(&width_arg);
    unsafe { launch.launch(grid((blocks, 1, 1), 256)) }.during(K)?;
    Ok(())
}

/// Stacks `[out_i, in_features]` weight matrices into one `[sum out_i, in_features]` matrix
/// (q, k, v -> qkv; gate, up -> gate_up). Each part's length must be a multiple of
/// `in_features`.
pub fn fuse_rows(parts: &[&[bf16]], in_features: usize) -> Result<Vec<bf16>> {
    if in_features == 0 {
        return Err(check::invalid("fuse_rows", "in_features is 0"));
    }
    if let Some(bad) = parts.iter().position(|p| p.len() % in_features != 0) {
        return Err(check::invalid(
            "fuse_rows",
            format!(
                "part {bad} has {} elements, not a multiple of in_features {in_features}",
                parts[bad].len()
            ),
        ));
    }
    Ok(parts.concat())
}
