//! Choosing the cuBLASLt algorithm of each decode GEMM by timing the candidates on the device.
//!
//! A decode step's products are thin: a few hundred rows against a weight matrix that must be
//! streamed from memory, so their speed is how many SMs the chosen kernel keeps reading. cuBLAS's
//! default heuristic is built for the general case; for N = 1,024 outputs it launches fewer
//! thread blocks than an H100 has SMs. cuBLASLt lists the kernels it has for a shape (tile sizes,
//! split-K) and this module times them, with the model's own weights cycled so that none stays
//! in L2 as in a real step, and keeps the fastest when it beats the default: the idea of
//! PyTorch's TunableOp and of vLLM's and TensorRT-LLM's GEMM tuning passes.
//!
//! A tuned shape runs through cuBLASLt with its algorithm ([`crate::linear::linear`] looks it
//! up); every other shape keeps cuBLAS's default.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::check;
use crate::device::Gpu;
use crate::error::{DriverContext, Error, Result};
use crate::graph;
use crate::linear::{self, GemmOutput};

/// cuBLASLt's scratch memory, allocated on the first tuning: split-K kernels keep their partial
/// sums there. 32 MiB is what NVIDIA recommends for Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Candidates asked of cuBLASLt's heuristic for each shape.
const CANDIDATES: i32 = 16;

/// Output elements compared with the default's, at each end of the output.
const SAMPLE: usize = 1 << 15;

/// Timed rounds per candidate; the fastest round counts (the others are noise from clocks).
const ROUNDS: usize = 3;

/// A product `y[tokens, out_features] = x[tokens, in_features] · w^T`, output f32 or bf16.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmShape {
    pub tokens: usize,
    pub out_features: usize,
    pub in_features: usize,
    pub f32_out: bool,
}

/// What tuning one shape found, device time per call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuned {
    pub shape: GemmShape,
    /// cuBLAS's default algorithm.
    pub default_us: f64,
    /// The fastest candidate, the default included.
    pub best_us: f64,
    /// Whether the fastest was a cuBLASLt algorithm (and is used from now on).
    pub through_lt: bool,
    /// Candidates timed, the default included.
    pub timed: usize,
    /// Candidates dropped because they failed to run or their output differed from the
    /// default's.
    pub rejected: usize,
    /// Candidates dropped because a CUDA graph could not record them (the decode step is
    /// replayed from graphs, so a kernel that cannot be captured is no use there).
    pub uncapturable: usize,
}

/// The tuning state a [`Gpu`] carries: the cuBLASLt handle and its workspace (made on first
/// use) and the algorithm chosen for each tuned shape.
#[derive(Default)]
pub(crate) struct GemmTuning {
    lt: OnceLock<LtHandle>,
    chosen: Mutex<HashMap<GemmShape, lt_sys::cublasLtMatmulAlgo_t>>,
}

impl GemmTuning {
    pub(crate) fn chosen(&self, shape: &GemmShape) -> Option<lt_sys::cublasLtMatmulAlgo_t> {
        self.chosen
            .lock()
            .expect("not poisoned")
            .get(shape)
            .copied()
    }
}

struct LtHandle {
    handle: lt_sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// Safety: a cuBLASLt handle may be used from any thread; this crate queues all work on one
// stream, and the handle is only read after it is made.
unsafe impl Send for LtHandle {}
unsafe impl Sync for LtHandle {}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // Safety: made by `cublasLtCreate` and destroyed only here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

fn lt_handle(gpu: &Gpu) -> Result<&LtHandle> {
    if let Some(h) = gpu.gemm_tuning().lt.get() {
        return Ok(h);
    }
    if !unsafe { lt_sys::is_culib_present() } {
        return Err(Error::MissingLibrary { lib: "cublasLt" });
    }
    let handle = lt::create_handle()?;
    let workspace = gpu.zeros::<u8>(WORKSPACE_BYTES)?;
    Ok(gpu
        .gemm_tuning()
        .lt
        .get_or_init(|| LtHandle { handle, workspace }))
}

/// The descriptors of one product, in the column-major terms of [`crate::linear`]:
/// `Y^T[out, tokens] = op_T(W^T[in, out]) · X^T[in, tokens]`.
struct Descriptors {
    op: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    c: lt_sys::cublasLtMatrixLayout_t,
}

impl Descriptors {
    fn new<T: GemmOutput>(shape: &GemmShape) -> Result<Self> {
        let (m, n, k) = (
            shape.out_features as u64,
            shape.tokens as u64,
            shape.in_features as u64,
        );
        let op = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )?;
        // cuBLASLt takes cuBLAS's own operation enum.
        let transpose = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        // Safety: `op` is live and the attribute's value is a `cublasOperation_t`.
        unsafe {
            lt::set_matmul_desc_attribute(
                op,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&transpose as *const cudarc::cublas::sys::cublasOperation_t).cast(),
                std::mem::size_of_val(&transpose),
            )?
        };
        let bf = lt_sys::cudaDataType::CUDA_R_16BF;
        Ok(Self {
            op,
            a: lt::create_matrix_layout(bf, k, m, k as i64)?,
            b: lt::create_matrix_layout(bf, k, n, k as i64)?,
            c: lt::create_matrix_layout(T::LT_TYPE, m, n, m as i64)?,
        })
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // Safety: each was made in `new` and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.op);
        }
    }
}

/// Runs one product through cuBLASLt with `algo`. Pointers are device addresses of buffers
/// whose sizes the caller checked.
pub(crate) fn run<T: GemmOutput>(
    gpu: &Gpu,
    shape: &GemmShape,
    algo: &lt_sys::cublasLtMatmulAlgo_t,
    (w, x, y): (u64, u64, u64),
) -> Result<()> {
    let h = lt_handle(gpu)?;
    let d = Descriptors::new::<T>(shape)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    let workspace = gpu.ptr(&h.workspace);
    // Safety: the descriptors describe buffers of the checked sizes; beta is 0, so C is only
    // named, never read.
    unsafe {
        lt::matmul(
            h.handle,
            d.op,
            (&alpha as *const f32).cast(),
            (&beta as *const f32).cast(),
            w as *const c_void,
            d.a,
            x as *const c_void,
            d.b,
            y as *const c_void,
            d.c,
            y as *mut c_void,
            d.c,
            algo,
            workspace as *mut c_void,
            WORKSPACE_BYTES,
            gpu.stream().cu_stream() as lt_sys::cudaStream_t,
        )?
    };
    Ok(())
}

/// cuBLASLt's candidates for `shape` that fit the workspace.
fn candidates<T: GemmOutput>(
    gpu: &Gpu,
    shape: &GemmShape,
) -> Result<Vec<lt_sys::cublasLtMatmulAlgo_t>> {
    let h = lt_handle(gpu)?;
    let d = Descriptors::new::<T>(shape)?;
    let pref = lt::create_matmul_pref()?;
    let limit = WORKSPACE_BYTES as u64;
    // Safety: `pref` is live; the attribute's value is a u64.
    let set = unsafe {
        lt::set_matmul_pref_attribute(
            pref,
            lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            (&limit as *const u64).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    // Safety: zero bits are a valid heuristic result (plain integers and floats).
    let mut found: Vec<lt_sys::cublasLtMatmulHeuristicResult_t> =
        vec![unsafe { std::mem::zeroed() }; CANDIDATES as usize];
    let mut count = 0;
    let asked = set.and_then(|()| {
        // Safety: `found` holds CANDIDATES results; every descriptor is live.
        unsafe {
            lt_sys::cublasLtMatmulAlgoGetHeuristic(
                h.handle,
                d.op,
                d.a,
                d.b,
                d.c,
                d.c,
                pref,
                CANDIDATES,
                found.as_mut_ptr(),
                &mut count,
            )
        }
        .result()
    });
    // Safety: made above, destroyed once.
    let _ = unsafe { lt::destroy_matmul_pref(pref) };
    asked?;
    Ok(found
        .into_iter()
        .take(count.max(0) as usize)
        .filter(|r| {
            r.state == lt_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                && r.workspaceSize <= WORKSPACE_BYTES
        })
        .map(|r| r.algo)
        .collect())
}

/// Times cuBLAS's default and cuBLASLt's candidates for `y = x · w^T` over `weights` (all of one
/// shape: the model's layers, cycled so that each call reads its weight from memory, as a
/// decode step does), and makes [`crate::linear::linear`] use the fastest for this shape from
/// now on. `x` and `y` are scratch buffers of at least `tokens` rows; `y` is overwritten.
///
/// Candidates whose output differs from the default's by more than rounding are dropped, and
/// so are those a CUDA graph cannot record. Must not run during a graph capture (it
/// synchronises); tune first, then capture.
#[allow(clippy::too_many_arguments)]
pub fn tune_linear<T: GemmOutput>(
    gpu: &Gpu,
    weights: &[&CudaSlice<bf16>],
    x: &impl DevicePtr<bf16>,
    y: &mut impl DevicePtrMut<T>,
    tokens: usize,
    out_features: usize,
    in_features: usize,
) -> Result<Tuned> {
    const K: &str = "tune_linear";
    if weights.is_empty() || tokens == 0 || out_features == 0 || in_features == 0 {
        return Err(check::invalid(
            K,
            "nothing to tune: no weights or an empty shape",
        ));
    }
    for (i, w) in weights.iter().enumerate() {
        check::at_least(
            K,
            &format!("weight {i}"),
            w.len(),
            out_features * in_features,
        )?;
    }
    check::at_least(K, "x", x.len(), tokens * in_features)?;
    check::at_least(K, "y", y.len(), tokens * out_features)?;
    let shape = GemmShape {
        tokens,
        out_features,
        in_features,
        f32_out: T::F32,
    };
    gpu.gemm_tuning()
        .chosen
        .lock()
        .expect("not poisoned")
        .remove(&shape);
    let algos = candidates::<T>(gpu, &shape)?;
    let (px, py) = (gpu.ptr(x), gpu.ptr_mut(y));
    let pws: Vec<u64> = weights.iter().map(|w| gpu.ptr(*w)).collect();

    let call = |algo: Option<&lt_sys::cublasLtMatmulAlgo_t>, pw: u64| -> Result<()> {
        match algo {
            None => linear::default_gemm::<T>(gpu, (pw, px, py), &shape),
            Some(a) => run::<T>(gpu, &shape, a, (pw, px, py)),
        }
    };
    // The outputs compared: the first and last rows, up to SAMPLE elements each (a whole
    // lm_head output would be hundreds of MB per candidate).
    let len = tokens * out_features;
    let sample = SAMPLE.min(len / 2);
    let output = || -> Result<Vec<f32>> {
        let mut v = unsafe { download::<T>(gpu, py, sample) }?;
        let tail = (len - sample) * std::mem::size_of::<T>();
        v.extend(unsafe { download::<T>(gpu, py + tail as u64, sample) }?);
        Ok(v.into_iter().map(T::to_f32).collect())
    };

    call(None, pws[0])?;
    gpu.synchronize()?;
    let reference = output()?;
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
    let tolerance = if T::F32 { 1e-3 } else { 1e-2 } * scale;

    let mut kept: Vec<Option<lt_sys::cublasLtMatmulAlgo_t>> = vec![None];
    let (mut rejected, mut uncapturable) = (0, 0);
    for algo in &algos {
        let ran = call(Some(algo), pws[0]).and_then(|()| gpu.synchronize());
        let agrees = ran.is_ok()
            && output()?
                .iter()
                .zip(&reference)
                .all(|(a, b)| (a - b).abs() <= tolerance);
        if !agrees {
            rejected += 1;
        } else if graph::capture(gpu, || call(Some(algo), pws[0])).is_err() {
            uncapturable += 1;
        } else {
            kept.push(Some(*algo));
        }
    }

    let reps = pws.len().max(8);
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut best = vec![f64::INFINITY; kept.len()];
    for _ in 0..ROUNDS {
        for (i, algo) in kept.iter().enumerate() {
            let start = gpu
                .stream()
                .record_event(timing)
                .during("recording an event")?;
            for r in 0..reps {
                call(algo.as_ref(), pws[r % pws.len()])?;
            }
            let end = gpu
                .stream()
                .record_event(timing)
                .during("recording an event")?;
            end.synchronize().during("waiting for a timed GEMM")?;
            let ms = start.elapsed_ms(&end).during("reading an event")?;
            best[i] = best[i].min(ms as f64 * 1e3 / reps as f64);
        }
    }
    let (winner, &best_us) = best
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .expect("the default is always timed");
    let through_lt = winner != 0;
    if let Some(algo) = kept[winner] {
        gpu.gemm_tuning()
            .chosen
            .lock()
            .expect("not poisoned")
            .insert(shape, algo);
    }
    Ok(Tuned {
        shape,
        default_us: best[0],
        best_us,
        through_lt,
        timed: kept.len(),
        rejected,
        uncapturable,
    })
}

/// Copies `len` elements at device address `py` back to the host.
///
/// # Safety
/// `py` must address at least `len` live elements of `T`.
unsafe fn download<T: GemmOutput>(gpu: &Gpu, py: u64, len: usize) -> Result<Vec<T>> {
    let mut host = vec![T::default(); len];
    // Safety: the caller vouches for the source; `host` holds `len` elements.
    unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host, py, gpu.stream().cu_stream()) }
        .during("copying GEMM outputs back")?;
    gpu.synchronize()?;
    Ok(host)
}
