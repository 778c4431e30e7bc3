//! The `nanoserve` command line (see `nanoserve::cli`).

use clap::Parser;

/// The engine allocates a few small vectors per sequence every step (its batch, block tables,
/// outputs) and frees them the next: with glibc's allocator that was half of the engine's host
/// time per decode step (perf, `examples/host_only`), time during which the GPU waits.
/// mimalloc's thread-local free lists halve it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match nanoserve::cli::run(nanoserve::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nanoserve: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
