//! The `nanoserve` command line (see `phase6::cli`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    match phase6::cli::run(phase6::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nanoserve: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
