//! Chapter 6.5: the GPU ranks' collectives, through NCCL (the library vLLM and SGLang use
//! between GPUs), and finding that library at run time.
//!
//! Nothing NCCL is needed to build: cudarc opens `libnccl.so` when the first communicator is
//! made. The `nvidia-nccl-cu13` Python package ships it as `libnccl.so.2` only, a name cudarc's
//! loader does not try, so [`ensure_loadable`] looks for the file (the path in
//! [`LIBRARY_ENV`], the folders of `LD_LIBRARY_PATH`, the Python packages' folders) and says
//! where it looked when it finds nothing; the `nanoserve` command goes on by itself: it links the
//! file as `libnccl.so` in a folder of its own and starts again with that folder on the
//! loader's path.

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::nccl::{Comm, Id, ReduceOp};
use kernels::{CudaViewMut, Gpu};

/// An environment variable naming NCCL's library file (`.../libnccl.so.2`) when it is not on
/// the loader's path.
pub const LIBRARY_ENV: &str = "NANO_SERVING_NCCL_LIBRARY";
/// Set on the process started again with the linked folder, so it never loops.
const RESTARTED_ENV: &str = "NANO_SERVING_NCCL_RESTARTED";

/// True if cudarc can open NCCL now.
pub fn is_loadable() -> bool {
    // Safety: opening a shared library runs its initialisers; NCCL's only set up globals.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// The folders NCCL's library file is looked for in, in order.
fn search_folders() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var("LD_LIBRARY_PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect();
    let mut roots = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local/lib"));
    }
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        roots.push(Path::new(&venv).join("lib"));
    }
    for root in roots {
        let Ok(entries) = std::fs::read_dir(&root) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path())
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                dirs.push(python.join(packages).join("nvidia/nccl/lib"));
            }
        }
    }
    dirs
}

/// NCCL's library file: the one [`LIBRARY_ENV`] names, or the first `libnccl.so.2` (or
/// `libnccl.so`) in [`search_folders`]. `Err` lists where it looked.
pub fn find_library() -> Result<PathBuf, String> {
    let named = std::env::var_os(LIBRARY_ENV).map(PathBuf::from);
    find_in(named, &search_folders())
}

/// [`find_library`] with the named file and the folders given.
fn find_in(named: Option<PathBuf>, dirs: &[PathBuf]) -> Result<PathBuf, String> {
    if let Some(path) = named {
        return match path.is_file() {
            true => Ok(path),
            false => Err(format!("{LIBRARY_ENV}={} is not a file", path.display())),
        };
    }
    for dir in dirs {
        for name in ["libnccl.so", "libnccl.so.2"] {
            if dir.join(name).is_file() {
                return Ok(dir.join(name));
            }
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(format!(
        "NCCL library not found: no libnccl.so on the loader's path, and no libnccl.so.2 in {} \
         (install the nvidia-nccl-cu13 Python package, or set {LIBRARY_ENV} to the file)",
        looked.join(", ")
    ))
}

/// Makes NCCL loadable or says why it is not. When it is found under a name the loader does not
/// try and `restart` is set, links it as `libnccl.so` in a folder of its own and replaces this
/// process by the same command with that folder first on `LD_LIBRARY_PATH` (the loader reads
/// that variable only when a process starts); this returns only on failure then.
pub fn ensure_loadable(restart: bool) -> Result<(), String> {
    if is_loadable() {
        return Ok(());
    }
    let file = find_library()?;
    let not_loadable = || {
        format!(
            "NCCL library found at {} but not loadable as libnccl.so: link it as libnccl.so in \
             a folder on LD_LIBRARY_PATH",
            file.display()
        )
    };
    if !restart || std::env::var_os(RESTARTED_ENV).is_some() {
        return Err(not_loadable());
    }
    let dir = std::env::temp_dir().join(format!("nano-serving-nccl-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&file, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    let mut path = dir.into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    eprintln!(
        "NCCL: {} linked as {}; starting again with it on LD_LIBRARY_PATH",
        file.display(),
        link.display()
    );
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(RESTARTED_ENV, "1")
        .exec();
    Err(format!(
        "starting again with NCCL on the loader's path: {err}"
    ))
}

/// The version of the NCCL library loaded, as "2.27.7".
pub fn version() -> Result<String, String> {
    let mut v: std::ffi::c_int = 0;
    // Safety: ncclGetVersion writes one int; the library is loaded by `culib` or it panics,
    // so callers check `is_loadable` first.
    let status = unsafe { cudarc::nccl::sys::ncclGetVersion(&mut v) };
    if status != cudarc::nccl::sys::ncclResult_t::ncclSuccess {
        return Err(format!("ncclGetVersion: {status:?}"));
    }
    // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

/// A new group's identity, made once and handed to every rank.
pub fn new_group_id() -> Result<[std::ffi::c_char; 128], String> {
    Id::new()
        .map(|id| *id.internal())
        .map_err(|e| format!("creating an NCCL group: {e:?}"))
}

/// One GPU rank's link to the others: an NCCL communicator on the rank's stream, so its
/// collectives are queued with the rank's kernels and are recorded into its CUDA graphs.
///
/// Freeing a communicator waits until every rank of the host frees its own (NCCL 2.19 and
/// later), so the ranks of a group are freed together. A group whose start failed on some
/// rank cannot count on that, so it frees nothing: its communicators are left to the process's
/// exit, and the start fails with an error instead of waiting forever.
pub struct NcclGroup {
    comm: ManuallyDrop<Comm>,
    /// Set once every rank of the group has started.
    started: Arc<AtomicBool>,
}

// Safety: a communicator may be used from any thread as long as two threads do not use it at
// once; each rank's communicator is owned by that rank's runner alone.
unsafe impl Send for NcclGroup {}

impl NcclGroup {
    /// Joins group `id` as `rank` of `world_size` on `gpu`'s stream; returns when every rank
    /// has joined. `started` is set by whoever starts the ranks once all of them have.
    pub fn join(
        gpu: &Gpu,
        rank: usize,
        world_size: usize,
        id: [std::ffi::c_char; 128],
        started: Arc<AtomicBool>,
    ) -> Result<Self, String> {
        Comm::from_rank(gpu.stream().clone(), rank, world_size, Id::uninit(id))
            .map(|comm| Self {
                comm: ManuallyDrop::new(comm),
                started,
            })
            .map_err(|e| format!("rank {rank} joining the NCCL group: {e:?}"))
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// Every rank's `data` becomes the sum over ranks.
    pub fn all_reduce_sum<T: cudarc::nccl::NcclType>(
        &self,
        data: &mut CudaViewMut<'_, T>,
    ) -> kernels::Result<()> {
        self.comm
            .all_reduce_in_place(data, &ReduceOp::Sum)
            .map(|_| ())
            .map_err(|e| nccl_error("all-reduce", e))
    }

    /// Every rank's `local` laid end to end in rank order into `out` (`world_size` times its
    /// length), on every rank.
    pub fn all_gather(
        &self,
        local: &kernels::CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> kernels::Result<()> {
        self.comm
            .all_gather(local, out)
            .map(|_| ())
            .map_err(|e| nccl_error("all-gather", e))
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        if self.started.load(Ordering::Acquire) {
            // Safety: `comm` is dropped here only, once.
            unsafe { ManuallyDrop::drop(&mut self.comm) }
        }
    }
}

fn nccl_error(op: &'static str, e: cudarc::nccl::result::NcclError) -> kernels::Error {
    kernels::Error::Collective {
        op,
        message: format!("NCCL: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_found_by_name_or_in_a_folder_and_otherwise_the_folders_are_said() {
        let dir = std::env::temp_dir().join(format!("nccl-find-{}", std::process::id()));
        let lib = dir.join("nvidia/nccl/lib");
        std::fs::create_dir_all(&lib).unwrap();
        let file = lib.join("libnccl.so.2");
        std::fs::write(&file, b"").unwrap();
        assert_eq!(find_in(Some(file.clone()), &[]).unwrap(), file);
        let missing = dir.join("nothing.so");
        assert!(
            find_in(Some(missing), &[])
                .unwrap_err()
                .contains("is not a file")
        );
        let empty = dir.join("empty");
        assert_eq!(find_in(None, &[empty.clone(), lib.clone()]).unwrap(), file);
        let err = find_in(None, std::slice::from_ref(&empty)).unwrap_err();
        assert!(
            err.contains(&empty.display().to_string()) && err.contains(LIBRARY_ENV),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
