//! The phase-by-phase comparison: the same workload served five ways, each adding one chapter's
//! idea, with the measured throughput and latencies written as Markdown and SVG plots.
//!
//! 1. one request at a time; 2. static batching; 3. continuous batching (chapter 5);
//! 4. + chunked prefill (chapter 3); 5. + the radix prefix cache (chapter 4).
//!
//! Every mode must produce exactly the same tokens (the workload is greedy); the report says so.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use phase0::{SamplingParams, TokenId};
use phase2::{ModelConfig, ModelRunner, Weights};
use phase5::{Batching, Engine, SchedulerConfig};
use plotters::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

use crate::runners::build_runner;
use crate::workload::Percentiles;
use phase6::Config;
use phase6::Error;

/// The report's workload: requests sharing a few system prompts, mixed output lengths.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReportSpec {
    pub num_requests: usize,
    pub num_system_prompts: usize,
    pub system_prompt_len: usize,
    pub max_question_len: usize,
    pub max_output: usize,
    pub seats: usize,
    pub chunk_size: usize,
    pub seed: u64,
}

impl Default for ReportSpec {
    fn default() -> Self {
        Self {
            num_requests: 64,
            num_system_prompts: 4,
            system_prompt_len: 96,
            max_question_len: 64,
            max_output: 128,
            seats: 16,
            chunk_size: 64,
            seed: 0,
        }
    }
}

/// One mode's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeResult {
    pub name: String,
    pub seconds: f64,
    pub steps: usize,
    pub prompt_tokens: usize,
    pub prefill_tokens_computed: usize,
    pub output_tokens: usize,
    pub output_tok_s: f64,
    pub ttft_ms: Percentiles,
    pub latency_ms: Percentiles,
    pub tpot_ms: Percentiles,
    #[serde(skip)]
    pub outputs: Vec<Vec<TokenId>>,
}

fn workload(spec: &ReportSpec, vocab: usize) -> Vec<(Vec<TokenId>, usize)> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let top = vocab.min(10_000) as TokenId;
    let systems: Vec<Vec<TokenId>> = (0..spec.num_system_prompts)
        .map(|_| {
            (0..spec.system_prompt_len)
                .map(|_| rng.random_range(0..top))
                .collect()
        })
        .collect();
    (0..spec.num_requests)
        .map(|i| {
            let mut prompt = systems[i % systems.len()].clone();
            let q = rng.random_range(8..=spec.max_question_len.max(8));
            prompt.extend((0..q).map(|_| rng.random_range(0..top)));
            (prompt, rng.random_range(8..=spec.max_output.max(8)))
        })
        .collect()
}

fn modes(spec: &ReportSpec, base: &Config) -> Vec<(&'static str, SchedulerConfig)> {
    let plain = SchedulerConfig {
        max_num_batched_tokens: base.max_num_batched_tokens,
        max_num_seqs: spec.seats,
        chunk_size: None,
        enable_prefix_caching: false,
        batching: Batching::Continuous,
        max_model_len: base.max_model_len,
    };
    vec![
        (
            "one request at a time",
            SchedulerConfig {
                max_num_seqs: 1,
                ..plain
            },
        ),
        (
            "static batching",
            SchedulerConfig {
                batching: Batching::Static,
                ..plain
            },
        ),
        ("continuous batching", plain),
        (
            "+ chunked prefill",
            SchedulerConfig {
                chunk_size: Some(spec.chunk_size),
                ..plain
            },
        ),
        (
            "+ radix cache",
            SchedulerConfig {
                chunk_size: Some(spec.chunk_size),
                enable_prefix_caching: true,
                ..plain
            },
        ),
    ]
}

fn run_mode(
    name: &str,
    runner: Box<dyn ModelRunner>,
    scheduler: SchedulerConfig,
    eos: Vec<TokenId>,
    work: &[(Vec<TokenId>, usize)],
) -> Result<ModeResult, Error> {
    let mut engine = Engine::new(runner, scheduler, eos, 0)?;
    let start = Instant::now();
    let mut index = std::collections::HashMap::new();
    for (i, (prompt, n)) in work.iter().enumerate() {
        let params = SamplingParams::greedy()
            .with_max_tokens(*n)
            .with_ignore_eos(true);
        index.insert(engine.add_request(prompt.clone(), params)?, i);
    }
    let mut outputs = vec![Vec::new(); work.len()];
    let (mut ttft, mut latency, mut tpot) = (Vec::new(), Vec::new(), Vec::new());
    let (mut steps, mut prefill) = (0, 0);
    while !engine.is_finished() {
        let out = engine.step()?;
        steps += 1;
        prefill += out.num_prefill_tokens;
        for f in out.finished {
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
            ttft.extend(f.timing.ttft().map(ms));
            latency.extend(f.timing.latency().map(ms));
            tpot.extend(f.timing.tpot(f.output.len()).map(ms));
            outputs[index[&f.id]] = f.output;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let output_tokens: usize = outputs.iter().map(Vec::len).sum();
    Ok(ModeResult {
        name: name.to_string(),
        seconds,
        steps,
        prompt_tokens: work.iter().map(|(p, _)| p.len()).sum(),
        prefill_tokens_computed: prefill,
        output_tokens,
        output_tok_s: output_tokens as f64 / seconds,
        ttft_ms: Percentiles::of(&ttft),
        latency_ms: Percentiles::of(&latency),
        tpot_ms: Percentiles::of(&tpot),
        outputs,
    })
}

/// Serves the workload in every mode on a runner built from `config` (page size, device).
pub fn run_report(
    model_config: &ModelConfig,
    weights: &Weights,
    eos: Vec<TokenId>,
    config: &Config,
    spec: &ReportSpec,
) -> Result<Vec<ModeResult>, Error> {
    let work = workload(spec, model_config.vocab_size);
    let mut results = Vec::new();
    for (name, scheduler) in modes(spec, config) {
        let runner = build_runner(model_config.clone(), weights, config)?;
        results.push(run_mode(
            name,
            runner.runner as Box<dyn ModelRunner>,
            scheduler,
            eos.clone(),
            &work,
        )?);
    }
    Ok(results)
}

/// The report as Markdown; with `mask_timings` every measured time is replaced by `<t>` so the
/// text can be compared across runs (snapshot tests).
pub fn markdown(
    results: &[ModeResult],
    spec: &ReportSpec,
    setup: &str,
    mask_timings: bool,
) -> String {
    let t = |x: f64, unit: &str| {
        if mask_timings {
            "<t>".to_string()
        } else {
            format!("{x:.1}{unit}")
        }
    };
    let mut md = String::from("# nano-serving: phase-by-phase report\n\n");
    let _ = writeln!(md, "{setup}\n");
    let _ = writeln!(
        md,
        "Workload: {} requests at once, {} system prompts of {} tokens shared between them, a question of 8 to {} tokens each, {} to {} output tokens (greedy, EOS ignored), {} seats, chunk size {}.\n",
        spec.num_requests,
        spec.num_system_prompts,
        spec.system_prompt_len,
        spec.max_question_len,
        8,
        spec.max_output,
        spec.seats,
        spec.chunk_size
    );
    md.push_str("| mode | output tok/s | mean TTFT | mean latency | p99 time per output token | prefill tokens computed | steps |\n");
    md.push_str("| --- | --- | --- | --- | --- | --- | --- |\n");
    for r in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            t(r.output_tok_s, ""),
            t(r.ttft_ms.mean, " ms"),
            t(r.latency_ms.mean, " ms"),
            t(r.tpot_ms.p99, " ms"),
            r.prefill_tokens_computed,
            r.steps
        );
    }
    let differing = results.first().map_or(0, |first| {
        (0..first.outputs.len())
            .filter(|&i| {
                results
                    .iter()
                    .any(|r| r.outputs.get(i) != first.outputs.get(i))
            })
            .count()
    });
    if differing == 0 {
        md.push_str("\nEvery mode produced exactly the same tokens for every request.\n\n");
    } else {
        let _ = writeln!(
            md,
            "\n{differing} of {} requests got different tokens in different modes. The CPU runner \
             computes in f32 and batching never changes its results; GPU kernels compute in bf16 \
             and round differently for different batch shapes, so a greedy choice between two \
             nearly tied tokens can flip and the text goes its own way from there.\n",
            results.first().map_or(0, |r| r.outputs.len())
        );
    }
    md.push_str("![output tokens per second](throughput.svg)\n\n![latency](latency.svg)\n");
    md
}

fn svg_err(e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("drawing the report plots: {e}"))
}

/// Bar charts of throughput and of mean TTFT / latency, as `throughput.svg` and `latency.svg`.
pub fn write_plots(results: &[ModeResult], dir: &Path) -> Result<(), Error> {
    let n = results.len() as u32;
    let labels: Vec<String> = results.iter().map(|r| r.name.clone()).collect();
    let bars = |file: &str,
                title: &str,
                unit: &str,
                series: &[(&str, RGBColor, Vec<f64>)]|
     -> Result<(), Error> {
        let path = dir.join(file);
        let root = SVGBackend::new(&path, (900, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(svg_err)?;
        let top = series
            .iter()
            .flat_map(|s| s.2.iter().copied())
            .fold(0.0, f64::max)
            * 1.15
            + 1e-9;
        let per = series.len() as u32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0..n * (per + 1)).into_segmented(), 0f64..top)
            .map_err(svg_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels((n * (per + 1)) as usize)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(x) if x % (per + 1) == per / 2 => labels
                    .get((x / (per + 1)) as usize)
                    .cloned()
                    .unwrap_or_default(),
                _ => String::new(),
            })
            .y_desc(unit)
            .draw()
            .map_err(svg_err)?;
        for (k, (name, color, values)) in series.iter().enumerate() {
            let data = values
                .iter()
                .enumerate()
                .map(|(i, v)| (i as u32 * (per + 1) + k as u32, *v));
            chart
                .draw_series(
                    Histogram::vertical(&chart)
                        .style(color.filled())
                        .margin(4)
                        .data(data),
                )
                .map_err(svg_err)?
                .label(*name)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                });
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(svg_err)?;
        }
        root.present().map_err(svg_err)
    };
    bars(
        "throughput.svg",
        "Output tokens per second",
        "tokens/s",
        &[(
            "output tok/s",
            RGBColor(52, 101, 164),
            results.iter().map(|r| r.output_tok_s).collect(),
        )],
    )?;
    bars(
        "latency.svg",
        "Mean time to first token and mean latency",
        "ms",
        &[
            (
                "time to first token",
                RGBColor(245, 121, 0),
                results.iter().map(|r| r.ttft_ms.mean).collect(),
            ),
            (
                "latency",
                RGBColor(78, 154, 6),
                results.iter().map(|r| r.latency_ms.mean).collect(),
            ),
        ],
    )
}
