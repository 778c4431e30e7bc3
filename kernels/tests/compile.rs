//! Every kernel source compiles with NVRTC. This needs NVRTC and the CUDA headers but no GPU,
//! so it also runs on a machine with a toolkit and no device; without them it says it skipped.

mod common;

use common::skipped;
use kernels::compile::{Arch, Compiler, find_include_dir, nvrtc_version};
use kernels::{Error, Source};

fn compiler(cache: Option<std::path::PathBuf>) -> Option<Compiler> {
    if let Err(e) = nvrtc_version() {
        skipped(&e);
        return None;
    }
    match find_include_dir() {
        Ok(dir) => Some(Compiler::new(dir, cache)),
        Err(e) => {
            skipped(&e);
            None
        }
    }
}

const AMPERE: Arch = Arch { major: 8, minor: 0 };
const HOPPER: Arch = Arch { major: 9, minor: 0 };

#[test]
fn every_source_compiles_for_ampere_and_hopper() {
    let Some(compiler) = compiler(None) else {
        return;
    };
    for arch in [AMPERE, HOPPER] {
        for source in Source::ALL {
            if source.hopper_only() && arch != HOPPER {
                continue;
            }
            let cubin = compiler
                .compile(source.file(), &source.text(), arch)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.len() > 1000, "{} gave a tiny cubin", source.file());
        }
    }
}

#[test]
fn second_compile_comes_from_the_disk_cache() {
    let dir = std::env::temp_dir().join(format!("nano-serving-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(compiler) = compiler(Some(dir.clone())) else {
        return;
    };
    let source = Source::Merge;
    let first = compiler
        .compile(source.file(), &source.text(), HOPPER)
        .unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "one cubin cached");
    let start = std::time::Instant::now();
    let second = compiler
        .compile(source.file(), &source.text(), HOPPER)
        .unwrap();
    assert_eq!(first, second);
    assert!(
        start.elapsed().as_millis() < 50,
        "cache hit took {:?}",
        start.elapsed()
    );
    // A different architecture is a different entry.
    compiler
        .compile(source.file(), &source.text(), AMPERE)
        .unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_compile_error_carries_nvrtc_log() {
    let Some(compiler) = compiler(None) else {
        return;
    };
    let err = compiler
        .compile(
            "broken.cu",
            "__global__ void k() { undeclared_name = 1; }",
            HOPPER,
        )
        .unwrap_err();
    match &err {
        Error::Compile { file, log, .. } => {
            assert_eq!(file, "broken.cu");
            assert!(log.contains("undeclared_name"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other}"),
    }
    assert!(err.to_string().contains("undeclared_name"));
}

#[test]
fn missing_headers_error_names_where_it_looked() {
    let err = Error::MissingHeaders {
        searched: vec!["/opt/cuda/include".into(), "/usr/local/cuda/include".into()],
    };
    let text = err.to_string();
    assert!(text.contains("/opt/cuda/include") && text.contains("/usr/local/cuda/include"));
    assert!(text.contains("CUDA_HOME"));
}
