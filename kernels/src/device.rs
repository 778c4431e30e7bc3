//! The GPU handle: one context, one stream, one cuBLAS handle, and the kernel modules.
//!
//! Everything is queued on a single stream, so work is ordered without host synchronisation;
//! the host waits only where it asks to ([`Gpu::synchronize`], [`Gpu::download`]). cudarc's
//! per-buffer event tracking (useful with many streams) is switched off: with one stream it
//! would only add an event record to every launch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::compile::{Arch, Compiler};
use crate::error::{DriverContext, Error, Result};
use crate::source::Source;

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's scratch memory once it is fixed ([`Gpu::fix_blas_workspace`]).
    blas_workspace: Option<CudaSlice<u8>>,
    arch: Arch,
    num_sms: usize,
    compiler: Compiler,
    modules: [OnceLock<Arc<CudaModule>>; Source::ALL.len()],
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// [`Gpu::clusters_at_once`]'s answers, by kernel.
    at_once: Mutex<HashMap<&'static str, u32>>,
}

impl Gpu {
    /// Opens device `ordinal` with the compiler set up from the environment
    /// ([`Compiler::from_env`]). [`Error::NoDevice`] means there is no GPU to use here.
    pub fn open(ordinal: usize) -> Result<Self> {
        find_device(ordinal)?;
        Self::with_compiler(ordinal, Compiler::from_env()?)
    }

    pub fn with_compiler(ordinal: usize, compiler: Compiler) -> Result<Self> {
        find_device(ordinal)?;
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::MissingLibrary { lib: "cublas" });
        }
        let ctx = CudaContext::new(ordinal).during("creating the context")?;
        // Safety: no buffer exists yet, and this crate uses a single stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().during("creating the stream")?;
        let blas = CudaBlas::new(stream.clone())?;
        let (major, minor) = ctx
            .compute_capability()
            .during("reading the compute capability")?;
        let num_sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .during("reading the multiprocessor count")?;
        Ok(Self {
            ctx,
            stream,
            blas,
            blas_workspace: None,
            arch: Arch {
                major: major as u32,
                minor: minor as u32,
            },
            num_sms: num_sms as usize,
            compiler,
            modules: Default::default(),
            functions: Mutex::new(HashMap::new()),
            at_once: Mutex::new(HashMap::new()),
        })
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    pub fn name(&self) -> Result<String> {
        self.ctx.name().during("reading the device name")
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every launcher queues on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// Gives cuBLAS a scratch buffer of its own for good. Without one it allocates scratch
    /// memory as it goes, which a CUDA graph capture does not allow; with one, GEMMs can be
    /// captured. 32 MiB is what Hopper's kernels ask for at most.
    pub fn fix_blas_workspace(&mut self, bytes: usize) -> Result<()> {
        let mut workspace = self.zeros::<u8>(bytes.max(1))?;
        let ptr = self.ptr_mut(&mut workspace);
        unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(*self.blas.handle(), ptr as *mut _, bytes)
        }
        .result()?;
        self.blas_workspace = Some(workspace);
        Ok(())
    }

    /// Device memory `(free, total)` in bytes, as the driver reports it (other processes'
    /// allocations count as used).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().during("reading the memory size")
    }

    /// Compiles (or loads from the cache) and loads every kernel module this device runs now,
    /// so that the first forward step does not pay for it.
    pub fn preload(&self) -> Result<()> {
        for source in Source::ALL {
            if !source.hopper_only() || self.arch.is_hopper() {
                self.module(source)?;
            }
        }
        Ok(())
    }

    /// Waits for all queued work; a failed kernel reports its error here.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().during("synchronising the stream")
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).during("copying to the device")
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(len)
            .during("allocating device memory")
    }

    /// Page-locked host memory of `len` zeroed elements: copies from it to the device are
    /// asynchronous, the copy engine reads it directly. The caller must not rewrite it while a
    /// copy from it is still queued.
    pub fn pinned<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<PinnedHostSlice<T>> {
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }
            .during("allocating pinned host memory")?;
        let words = host.as_mut_ptr().during("reading pinned host memory")?;
        // Safety: the allocation holds `len.max(1)` elements and zero bits are a valid `T`.
        unsafe { std::ptr::write_bytes(words, 0, len.max(1)) };
        Ok(host)
    }

    /// Queues a copy of `host` into the start of `device` (asynchronous when `host` is pinned).
    pub fn copy_to_device<T: DeviceRepr>(
        &self,
        host: &[T],
        device: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        crate::check::at_least("copy_to_device", "device buffer", device.len(), host.len())?;
        self.stream
            .memcpy_htod(host, device)
            .during("copying to the device")
    }

    /// Copies a device buffer back; this waits for the work queued before it.
    pub fn download<T: DeviceRepr, S: DevicePtr<T>>(&self, device: &S) -> Result<Vec<T>> {
        let host = self
            .stream
            .clone_dtoh(device)
            .during("copying to the host")?;
        self.synchronize()?;
        Ok(host)
    }

    /// Copies a device buffer into the start of a pinned host buffer and waits for it. A decode
    /// step reads back a few hundred token ids every few milliseconds: from pinned memory the
    /// copy engine writes them directly, without a bounce through a driver buffer.
    pub fn download_pinned<'h, T: DeviceRepr + ValidAsZeroBits, S: DevicePtr<T>>(
        &self,
        device: &S,
        host: &'h mut PinnedHostSlice<T>,
    ) -> Result<&'h [T]> {
        crate::check::at_least("download_pinned", "host buffer", host.len(), device.len())?;
        self.stream
            .memcpy_dtoh(device, host)
            .during("copying to the host")?;
        self.synchronize()?;
        let n = device.len();
        let all = host.as_slice().during("reading pinned host memory")?;
        Ok(&all[..n])
    }

    /// Queues a copy of a device buffer into the start of a pinned host buffer and returns at
    /// once. The host buffer holds the values once `done` (recorded here) has completed:
    /// `done.synchronize()` waits for that. (This crate turns cudarc's own tracking of pinned
    /// buffers off, so nothing else waits.)
    pub fn queue_download<T: DeviceRepr + ValidAsZeroBits, S: DevicePtr<T>>(
        &self,
        device: &S,
        host: &mut PinnedHostSlice<T>,
        done: &CudaEvent,
    ) -> Result<()> {
        crate::check::at_least("queue_download", "host buffer", host.len(), device.len())?;
        self.stream
            .memcpy_dtoh(device, host)
            .during("copying to the host")?;
        self.record(done)
    }

    /// An event to mark a point in this stream's work with [`Gpu::record`].
    pub fn event(&self) -> Result<CudaEvent> {
        self.ctx.new_event(None).during("creating an event")
    }

    /// Marks the work queued so far: `event.synchronize()` then waits until it has run.
    pub fn record(&self, event: &CudaEvent) -> Result<()> {
        event.record(&self.stream).during("recording an event")
    }

    pub(crate) fn module(&self, source: Source) -> Result<&Arc<CudaModule>> {
        if source.hopper_only() && !self.arch.is_hopper() {
            return Err(crate::check::invalid(
                source.file(),
                format!("needs a Hopper GPU (sm_90), this one is {}", self.arch),
            ));
        }
        let slot = &self.modules[source.index()];
        if let Some(module) = slot.get() {
            return Ok(module);
        }
        let cubin = self
            .compiler
            .compile(source.file(), &source.text(), self.arch)?;
        let module = self
            .ctx
            .load_module(Ptx::from_binary(cubin))
            .during(format!("loading {}", source.file()))?;
        Ok(slot.get_or_init(|| module))
    }

    pub(crate) fn function(&self, source: Source, name: &'static str) -> Result<CudaFunction> {
        self.function_with(source, name, 0)
    }

    /// [`Gpu::function`] for a kernel that asks for `shared_bytes` of dynamic shared memory
    /// (above 48 KiB that needs the function's permission, given once when it is loaded).
    pub(crate) fn function_with(
        &self,
        source: Source,
        name: &'static str,
        shared_bytes: usize,
    ) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().expect("not poisoned").get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module(source)?
            .load_function(name)
            .during(format!("finding kernel {name}"))?;
        if shared_bytes > 0 {
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes as i32,
            )
            .during(format!(
                "allowing kernel {name} {shared_bytes} bytes of shared memory"
            ))?;
        }
        self.functions
            .lock()
            .expect("not poisoned")
            .insert(name, f.clone());
        Ok(f)
    }

    /// How many clusters of `blocks` blocks of `threads` threads of kernel `name` the device holds
    /// at once (with `blocks` 1, how many blocks), as the driver's occupancy calculator says;
    /// asked once a kernel, since a launch that picks its shape by it may come every step.
    pub(crate) fn clusters_at_once(
        &self,
        source: Source,
        name: &'static str,
        blocks: u32,
        threads: u32,
    ) -> Result<u32> {
        if let Some(&n) = self.at_once.lock().expect("not poisoned").get(name) {
            return Ok(n);
        }
        let f = self.function(source, name)?;
        let n = if blocks == 1 {
            let per_sm = f
                .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                .during(format!("occupancy of {name}"))?;
            per_sm * self.num_sms as u32
        } else {
            f.occupancy_max_active_clusters(grid((blocks, 1, 1), threads), &self.stream)
                .during(format!("occupancy of {name}"))?
        };
        self.at_once.lock().expect("not poisoned").insert(name, n);
        Ok(n)
    }

    /// Launches `f` on the stream with its arguments given as `args`, pointers to each
    /// argument's value in the kernel's order ([`arg`]); `name` is for errors. Where
    /// `dependent`, as a programmatic dependent launch (Hopper and later): its blocks may start
    /// before the kernel queued before it has finished (once that kernel runs
    /// `griddepcontrol.launch_dependents`, or as its blocks end), and must wait for it with
    /// `griddepcontrol.wait` before reading what it wrote or writing what it reads. Later work
    /// on the stream waits only for this kernel, so a thread of it must reach that wait before
    /// it ends. Before Hopper, or not `dependent`, a plain launch.
    ///
    /// # Safety
    /// As for any launch: the arguments must match the kernel's parameters.
    pub(crate) unsafe fn launch_args(
        &self,
        name: &str,
        f: &CudaFunction,
        config: cudarc::driver::LaunchConfig,
        args: &mut [*mut std::ffi::c_void],
        dependent: bool,
    ) -> Result<()> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread().during("binding the context")?;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: unsafe { std::mem::zeroed() },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        // Kernels are compiled for the device's own architecture (`Compiler::options`), so on
        // compute capability 9 and later the kernel holds its `griddepcontrol.wait`; an earlier
        // architecture's binary run here would not wait, and must not be launched this way.
        let programmatic = dependent && self.arch.major >= 9;
        let launch = sys::CUlaunchConfig {
            gridDimX: config.grid_dim.0,
            gridDimY: config.grid_dim.1,
            gridDimZ: config.grid_dim.2,
            blockDimX: config.block_dim.0,
            blockDimY: config.block_dim.1,
            blockDimZ: config.block_dim.2,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if programmatic {
                &mut attr
            } else {
                std::ptr::null_mut()
            },
            numAttrs: programmatic as u32,
        };
        unsafe {
            sys::cuLaunchKernelEx(
                &launch,
                f.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .during(format!("launching {name}"))
    }

    /// The raw device address of a buffer, for a kernel argument.
    pub(crate) fn ptr<T>(&self, buffer: &impl DevicePtr<T>) -> u64 {
        // With event tracking off the returned guard records nothing.
        let (ptr, _guard) = buffer.device_ptr(&self.stream);
        ptr
    }

    pub(crate) fn ptr_mut<T>(&self, buffer: &mut impl DevicePtrMut<T>) -> u64 {
        let (ptr, _guard) = buffer.device_ptr_mut(&self.stream);
        ptr
    }

    pub(crate) fn ptr_dyn<T>(&self, buffer: &mut dyn DevicePtrMut<T>) -> u64 {
        let (ptr, _guard) = buffer.device_ptr_mut(&self.stream);
        ptr
    }
}

/// Fails with [`Error::NoDevice`] unless the driver is installed and device `ordinal` exists.
/// How many CUDA devices this machine has; [`Error::NoDevice`] when there is no driver.
pub fn device_count() -> Result<usize> {
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::NoDevice(
            "the CUDA driver library (libcuda) is not installed".into(),
        ));
    }
    cudarc::driver::result::init()
        .map_err(|e| Error::NoDevice(format!("the CUDA driver did not start: {e}")))?;
    let count = CudaContext::device_count()
        .map_err(|e| Error::NoDevice(format!("cannot count devices: {e}")))?;
    Ok(count.max(0) as usize)
}

fn find_device(ordinal: usize) -> Result<()> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(Error::NoDevice(format!(
            "device {ordinal} requested, {count} present"
        )));
    }
    Ok(())
}

/// A launch shape with no dynamic shared memory (every kernel here sizes its shared memory
/// statically).
pub(crate) fn grid(blocks: (u32, u32, u32), threads: u32) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: blocks,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel argument for [`Gpu::launch_args`]: the address of its value.
pub(crate) fn arg<T>(value: &T) -> *mut std::ffi::c_void {
    value as *const T as *mut std::ffi::c_void
}
