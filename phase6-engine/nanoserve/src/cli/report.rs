//! `nanoserve report`: the phase-by-phase comparison written to a folder as Markdown and SVG.

use std::path::PathBuf;

use clap::Args;

use super::ModelArgs;
use crate::report::{ReportSpec, markdown, run_report, write_plots};
use phase6::Error;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Folder for report.md, report.json, throughput.svg and latency.svg
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    #[arg(long, default_value_t = 128)]
    pub max_output: usize,
    /// KV page size of every mode (small pages let the radix cache share short prefixes)
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// The machine the report ran on, in one line.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cores} cores, {cpu}")
}

pub fn run(args: ReportArgs) -> Result<(), Error> {
    let (model_config, weights, tokenizer, name) = args.model.load_parts()?;
    let mut config = args.model.engine_config()?;
    config.kvcache_block_size = args.page_size;
    config.validate()?;
    let mut eos = model_config.eos_token_ids.clone();
    eos.extend(
        tokenizer
            .iter()
            .flat_map(|t| t.eos_token_ids().iter().copied()),
    );
    let spec = ReportSpec {
        num_requests: args.requests,
        max_output: args.max_output,
        ..ReportSpec::default()
    };
    let results = run_report(&model_config, &weights, eos, &config, &spec)?;
    let device = crate::runners::build_runner(model_config.clone(), &weights, &config)?;
    let setup = format!(
        "Model: {name}. Runner: {}. Machine: {}.",
        device.report,
        machine()
    );
    std::fs::create_dir_all(&args.out)
        .map_err(|e| Error::Internal(format!("{}: {e}", args.out.display())))?;
    let md = markdown(&results, &spec, &setup, false);
    let write = |file: &str, text: String| {
        let path = args.out.join(file);
        std::fs::write(&path, text).map_err(|e| Error::Internal(format!("{}: {e}", path.display())))
    };
    write("report.md", md.clone())?;
    write(
        "report.json",
        serde_json::to_string_pretty(&results).map_err(|e| Error::Internal(e.to_string()))?,
    )?;
    write_plots(&results, &args.out)?;
    println!("{md}");
    println!(
        "wrote {}/report.md, report.json, throughput.svg, latency.svg",
        args.out.display()
    );
    Ok(())
}
