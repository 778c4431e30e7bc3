//! CUDA graphs: a recorded sequence of launches that the GPU replays with one call.
//!
//! A decode step of a small model is hundreds of short kernels; launched one by one, the CPU's
//! launch overhead (a few microseconds each) can exceed the GPU's work. Captured once into a
//! graph, the whole step is submitted at once. A graph replays the exact launches it recorded,
//! with the same arguments: its inputs must live at fixed device addresses, rewritten before
//! each replay, and any host-side decision (grid sizes, split counts) is frozen at capture.
//! cuBLAS GEMMs can be captured once its workspace is fixed ([`Gpu::fix_blas_workspace`]).

use cudarc::driver::{CudaGraph, sys};

use crate::check;
use crate::device::Gpu;
use crate::error::{DriverContext, Result};

/// A captured, instantiated graph, replayed on the stream it was captured on.
pub struct Graph {
    graph: CudaGraph,
}

// Safety: a graph may move to another thread; it is never used from two threads at once
// (launching needs `&self` of an owner that is itself not shared without synchronisation).
unsafe impl Send for Graph {}

impl Graph {
    /// Queues one replay.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch().during("launching a CUDA graph")
    }
}

/// Records every launch `body` queues on `gpu`'s stream, without running any of them. `body`
/// must not wait for the device (no downloads, no synchronisation). The capture is closed
/// whatever `body` returns, so the stream is usable afterwards.
pub fn capture(gpu: &Gpu, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
    let stream = gpu.stream();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .during("starting a graph capture")?;
    let recorded = body();
    let ended = stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .during("ending a graph capture");
    recorded?;
    match ended? {
        Some(graph) => Ok(Graph { graph }),
        None => Err(check::invalid("capture", "nothing was recorded")),
    }
}
