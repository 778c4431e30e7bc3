//! What people read from the command line: the help texts and the report, pinned by snapshots
//! (timings masked), and the CLI's errors.

use clap::CommandFactory;
use nanoserve::cli::Cli;
use nanoserve::report::{ReportSpec, markdown, run_report, write_plots};
use phase6::Config;

fn help(path: &[&str]) -> String {
    let mut cmd = Cli::command();
    for p in path {
        cmd = cmd.find_subcommand(p).expect("subcommand").clone();
    }
    cmd.render_long_help().to_string()
}

#[test]
fn help_texts() {
    insta::assert_snapshot!("nanoserve_help", help(&[]));
    insta::assert_snapshot!("nanoserve_generate_help", help(&["generate"]));
    insta::assert_snapshot!("nanoserve_bench_help", help(&["bench"]));
    insta::assert_snapshot!("nanoserve_report_help", help(&["report"]));
    insta::assert_snapshot!("nanoserve_chat_help", help(&["chat"]));
    insta::assert_snapshot!("nanoserve_serve_help", help(&["serve"]));
}

#[test]
fn report_markdown_and_plots() {
    let dir = phase2::default_model_dir();
    let model_config = phase2::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = phase2::Weights::open(&dir).unwrap();
    let config = Config {
        device: phase6::Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 16 << 20,
        max_model_len: 2048,
        ..Config::default()
    };
    let spec = ReportSpec {
        num_requests: 6,
        max_output: 10,
        seats: 3,
        max_question_len: 12,
        system_prompt_len: 32,
        chunk_size: 16,
        ..ReportSpec::default()
    };
    let results = run_report(&model_config, &weights, vec![0], &config, &spec).unwrap();
    let md = markdown(
        &results,
        &spec,
        "Model: tiny-shakespeare. Runner: <masked>.",
        true,
    );
    insta::assert_snapshot!(md);
    let out = std::env::temp_dir().join(format!("nano-serving-report-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    write_plots(&results, &out).unwrap();
    for plot in ["throughput.svg", "latency.svg"] {
        let svg = std::fs::read_to_string(out.join(plot)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("+ radix cache"),
            "{plot} draws every mode"
        );
    }
}

#[test]
fn bad_command_lines_are_refused_with_a_reason() {
    let err = Cli::try_parse_from(["nanoserve", "generate"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("<PROMPTS>"), "{err}");
    let err = Cli::try_parse_from(["nanoserve", "bench", "--random-weights"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("--config"), "{err}");
    use clap::Parser;
    let cli = Cli::try_parse_from(["nanoserve", "generate", "x", "--device", "tpu"]).unwrap();
    let err = nanoserve::cli::run(cli).unwrap_err().to_string();
    assert!(err.contains("device \"tpu\""), "{err}");
    // An FP8 K/V cache: vLLM's names only, one rank; a build without CUDA says so.
    let refused = |extra: &[&str]| {
        let mut args = vec!["nanoserve", "generate", "x"];
        args.extend_from_slice(extra);
        let cli = Cli::try_parse_from(args).unwrap();
        nanoserve::cli::run(cli).unwrap_err().to_string()
    };
    let err = refused(&["--kv-cache-dtype", "fp8_e5m2"]);
    assert!(
        err.contains("kv_cache_dtype \"fp8_e5m2\": expected auto, fp8 or fp8_e4m3"),
        "{err}"
    );
    if !cfg!(feature = "cuda") {
        let err = refused(&["--kv-cache-dtype", "fp8", "--device", "cuda"]);
        assert!(err.contains("this build has no CUDA support"), "{err}");
    }
    let err = refused(&[
        "--kv-cache-dtype",
        "fp8",
        "--device",
        "cpu",
        "--tensor-parallel-size",
        "2",
    ]);
    assert!(err.contains("with tensor_parallel_size = 2"), "{err}");
    // What the model needs of the config is refused before any weight is made or read.
    let config = phase6::models_dir().join("../configs/mistral-7b-v0.1.json");
    let cli = Cli::try_parse_from([
        "nanoserve",
        "generate",
        "x",
        "--device",
        "cpu",
        "--random-weights",
        "--config",
        config.to_str().unwrap(),
        "--max-model-len",
        "8192",
    ])
    .unwrap();
    let err = nanoserve::cli::run(cli).unwrap_err().to_string();
    assert!(
        err.contains("sliding-window attention over 4096 tokens"),
        "{err}"
    );
}
