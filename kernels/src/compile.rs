//! Run-time compilation of the CUDA C sources with NVRTC, and an on-disk cache of the results.
//!
//! Kernels are compiled on first use for the GPU that is actually present (its compute
//! capability, e.g. `sm_90` on Hopper), so the build needs no CUDA toolkit and the machine code
//! is the device's own. NVRTC returns a cubin (final machine code, no JIT at load time); it is
//! cached under a SHA-256 of everything that determines it, so a second start loads it from
//! disk in milliseconds.

use std::ffi::{CString, c_char};
use std::fmt;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// A GPU architecture, as NVRTC names it (`sm_90` for compute capability 9.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    /// The target NVRTC compiles for: on Hopper (9.0) the architecture-specific `sm_90a`,
    /// whose machine code runs on that generation only and which alone has the warpgroup
    /// instructions (`wgmma`) of `prefill_hopper.cu`; elsewhere the portable `sm_XY`.
    pub fn target(&self) -> String {
        if self.is_hopper() {
            "sm_90a".to_string()
        } else {
            self.to_string()
        }
    }

    /// Whether this is Hopper, where the `sm_90a` sources compile.
    pub fn is_hopper(&self) -> bool {
        (self.major, self.minor) == (9, 0)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}{}", self.major, self.minor)
    }
}

/// Compiles CUDA C sources to cubins for one include folder, with an optional disk cache.
#[derive(Debug, Clone)]
pub struct Compiler {
    include_dir: PathBuf,
    cache_dir: Option<PathBuf>,
}

impl Compiler {
    /// Headers from `CUDA_HOME`, `CUDA_PATH` or `/usr/local/cuda`; cache from
    /// [`default_cache_dir`].
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(find_include_dir()?, default_cache_dir()))
    }

    pub fn new(include_dir: PathBuf, cache_dir: Option<PathBuf>) -> Self {
        Self {
            include_dir,
            cache_dir,
        }
    }

    pub fn include_dir(&self) -> &Path {
        &self.include_dir
    }

    pub fn cache_dir(&self) -> Option<&Path> {
        self.cache_dir.as_deref()
    }

    /// NVRTC options for `arch`: the device's own machine code, C++17, line info for profilers.
    pub fn options(&self, arch: Arch) -> Vec<String> {
        vec![
            format!("--gpu-architecture={}", arch.target()),
            "--std=c++17".to_string(),
            "--generate-line-info".to_string(),
            format!("--include-path={}", self.include_dir.display()),
        ]
    }

    /// The cubin of `source` (named `file` in messages) for `arch`, from the cache if present.
    pub fn compile(&self, file: &str, source: &str, arch: Arch) -> Result<Vec<u8>> {
        let options = self.options(arch);
        let cached = self.cache_dir.as_ref().map(|dir| {
            dir.join(format!(
                "{}-{}.cubin",
                stem(file),
                cache_key(source, &options)
            ))
        });
        if let Some(path) = &cached
            && let Ok(bytes) = std::fs::read(path)
        {
            return Ok(bytes);
        }
        let cubin = nvrtc_compile(file, source, arch, &options)?;
        if let Some(path) = &cached {
            store(path, &cubin)?;
        }
        Ok(cubin)
    }
}

/// The cache folder: `$NANO_SERVING_CACHE`, else `$XDG_CACHE_HOME/nano-serving`, else
/// `~/.cache/nano-serving`; `None` when none of them can be determined.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = env("NANO_SERVING_CACHE")
        .map(PathBuf::from)
        .or_else(|| env("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("nano-serving")))
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache/nano-serving")))?;
    Some(base.join("kernels"))
}

/// The first of `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include` that
/// holds `cuda_bf16.h`.
pub fn find_include_dir() -> Result<PathBuf> {
    let mut searched = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            searched.push(PathBuf::from(root).join("include"));
        }
    }
    searched.push(PathBuf::from("/usr/local/cuda/include"));
    match searched.iter().find(|d| d.join("cuda_bf16.h").is_file()) {
        Some(dir) => Ok(dir.clone()),
        None => Err(Error::MissingHeaders { searched }),
    }
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

fn ensure_nvrtc() -> Result<()> {
    if unsafe { nvrtc_sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::MissingLibrary { lib: "nvrtc" })
    }
}

fn stem(file: &str) -> &str {
    file.rsplit('/')
        .next()
        .unwrap_or(file)
        .trim_end_matches(".cu")
}

/// Everything the cubin depends on: the source, the options (architecture and header folder
/// included) and the compiler's version.
fn cache_key(source: &str, options: &[String]) -> String {
    let mut hash = Sha256::new();
    hash.update(source.as_bytes());
    for option in options {
        hash.update([0u8]);
        hash.update(option.as_bytes());
    }
    if let Ok((major, minor)) = nvrtc_version() {
        hash.update(format!("\0nvrtc {major}.{minor}").as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes through a temporary file and a rename, so a reader never sees half a cubin.
fn store(path: &Path, bytes: &[u8]) -> Result<()> {
    let err = |source| Error::Cache {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().expect("cache files live in a folder");
    std::fs::create_dir_all(dir).map_err(err)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Destroys the NVRTC program on every path out of [`nvrtc_compile`].
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

fn nvrtc_compile(file: &str, source: &str, arch: Arch, options: &[String]) -> Result<Vec<u8>> {
    ensure_nvrtc()?;
    let src = CString::new(source).expect("kernel sources hold no NUL byte");
    let name = CString::new(file).expect("file names hold no NUL byte");
    let program = Program(nvrtc::create_program(&src, Some(&name))?);
    if unsafe { nvrtc::compile_program(program.0, options) }.is_err() {
        let log = unsafe { nvrtc::get_program_log(program.0) }?;
        let log: Vec<u8> = log
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        return Err(Error::Compile {
            file: file.to_string(),
            arch: arch.target(),
            options: options.join(" "),
            log: String::from_utf8_lossy(&log).into_owned(),
        });
    }
    let mut size = 0usize;
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program.0, &mut size) }.result()?;
    let mut cubin = vec![0u8; size];
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr() as *mut c_char) }.result()?;
    Ok(cubin)
}
