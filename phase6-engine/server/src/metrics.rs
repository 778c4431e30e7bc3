//! `GET /metrics` in the Prometheus text format: what a dashboard of a serving engine shows
//! (seats and queue, KV pages, prefix-cache hit rate, token counts and rate, finishes by
//! reason). The values come from the engine thread between two steps, so they are
//! consistent with each other.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::routes::AppState;
use crate::stats::EngineStats;
use phase6_openai::ApiError;

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

pub fn render(s: &EngineStats) -> String {
    let mut out = String::new();
    let m = &mut out;
    metric(
        m,
        "nano_requests_running",
        "gauge",
        "Requests holding a seat (prefilling or decoding).",
        s.running,
    );
    metric(
        m,
        "nano_requests_waiting",
        "gauge",
        "Requests queued for a seat.",
        s.waiting,
    );
    metric(
        m,
        "nano_kv_pages_total",
        "gauge",
        "KV pages of the pool.",
        s.kv_pages_total,
    );
    metric(
        m,
        "nano_kv_pages_used",
        "gauge",
        "KV pages with a holder (requests, prefix cache, chunks).",
        s.kv_pages_used,
    );
    metric(
        m,
        "nano_kv_pages_cached",
        "gauge",
        "KV pages held by the prefix cache (some may be shared with requests).",
        s.kv_pages_cached,
    );
    metric(
        m,
        "nano_kv_pages_chunks",
        "gauge",
        "KV pages held for registered chunks.",
        s.kv_pages_chunks,
    );
    metric(
        m,
        "nano_kv_page_holds_requests",
        "gauge",
        "Holds on KV pages by requests in flight (0 whenever no request runs).",
        s.kv_page_holds_requests,
    );
    metric(
        m,
        "nano_kv_page_size_tokens",
        "gauge",
        "Tokens per KV page.",
        s.kv_page_size,
    );
    if let Some(rate) = s.prefix_cache_hit_rate {
        metric(
            m,
            "nano_prefix_cache_hit_rate",
            "gauge",
            "Fraction of looked-up prompt tokens found in the prefix cache.",
            rate,
        );
    }
    metric(
        m,
        "nano_preemptions_total",
        "counter",
        "Running requests sent back to the queue for lack of KV pages.",
        s.preemptions_total,
    );
    metric(
        m,
        "nano_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        s.prompt_tokens_total,
    );
    metric(
        m,
        "nano_generation_tokens_total",
        "counter",
        "Tokens generated.",
        s.generation_tokens_total,
    );
    metric(
        m,
        "nano_generation_tokens_per_second",
        "gauge",
        "Tokens generated per second over the last 10 seconds.",
        format!("{:.3}", s.generation_tokens_per_second),
    );
    metric(
        m,
        "nano_requests_rejected_total",
        "counter",
        "Requests the engine refused (prompt too long, bad values).",
        s.requests_rejected_total,
    );
    let name = "nano_requests_finished_total";
    let _ = writeln!(
        m,
        "# HELP {name} Requests that left the engine, by reason.\n# TYPE {name} counter"
    );
    let f = s.requests_finished_total;
    for (reason, n) in [
        ("stop", f.stop),
        ("length", f.length),
        ("abort", f.abort),
        ("error", f.error),
    ] {
        let _ = writeln!(m, "{name}{{reason=\"{reason}\"}} {n}");
    }
    out
}

pub async fn metrics(State(app): State<AppState>) -> Result<Response, ApiError> {
    let stats = app.engine.stats().await?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&stats),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_help_type_and_a_value() {
        let s = EngineStats {
            kv_pages_total: 64,
            kv_pages_used: 3,
            prefix_cache_hit_rate: Some(0.25),
            ..EngineStats::default()
        };
        let text = render(&s);
        assert!(text.contains("\nnano_kv_pages_used 3\n"));
        assert!(text.contains("\nnano_prefix_cache_hit_rate 0.25\n"));
        assert!(text.contains("nano_requests_finished_total{reason=\"abort\"} 0\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{name}");
        }
    }
}
