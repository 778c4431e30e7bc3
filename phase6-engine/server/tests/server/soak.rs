//! The soak test: 1,000 mixed requests over loopback, 16 at a time: streamed and whole
//! completions and chats, `n` > 1 and prompt lists with log-probabilities, generations from
//! chunks, malformed bodies, bad fields, prompts longer than the context, clients that leave
//! mid-stream and clients that read slowly; then the drain (what SIGTERM triggers) with
//! streams in flight. Every request gets its expected answer, every KV page held by a request
//! comes back, and the process's RSS after the last wave is within 10% of the first's.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use phase6::Config;
use phase6_server::{AccessLog, Drained, ServeOptions};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestServer, config, read_events, start_stoppable, stream_text};

const REQUESTS: usize = 1000;
const WAVES: usize = 5;
const AT_ONCE: usize = 16;

/// The resident set of this process (server and clients), in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn ids(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| 5 + i * 7 % 1900).collect()
}

/// Request `i` of the mix; returns what it was, for the failure message.
async fn one(s: &TestServer, i: usize, chunks: &Value) -> &'static str {
    let stream = |max: usize| json!({"prompt": "ROMEO:\n", "max_tokens": max, "temperature": 0.8, "seed": i, "ignore_eos": true, "stream": true});
    match i % 10 {
        0 => {
            let events = s.stream("/v1/completions", &stream(8)).await;
            assert_eq!(stream_text(&events).2, "length");
            "stream"
        }
        1 => {
            let body =
                json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "n": 2});
            let (status, v) = s.post_json("/v1/chat/completions", &body).await;
            assert_eq!(status, StatusCode::OK, "{v}");
            assert_eq!(v["choices"].as_array().unwrap().len(), 2);
            "chat n=2"
        }
        2 => {
            let body = json!({"prompt": ["ROMEO:", [5, 9, 30]], "max_tokens": 4, "logprobs": 1, "n": 2, "stream": i % 20 == 2});
            let resp = s.post("/v1/completions", &body).await;
            assert_eq!(resp.status(), StatusCode::OK);
            if i % 20 == 2 {
                read_events(resp).await;
            } else {
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["choices"].as_array().unwrap().len(), 4);
            }
            "prompt list"
        }
        3 => {
            let mut body = chunks.clone();
            body["max_tokens"] = json!(4);
            let (status, v) = s.post_json("/v1/chunks/generate", &body).await;
            assert_eq!(status, StatusCode::OK, "{v}");
            "chunks"
        }
        4 => {
            let resp = s
                .client
                .post(s.url("/v1/completions"))
                .header("content-type", "application/json")
                .body("{\"prompt\": ")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
            "malformed"
        }
        5 => {
            let (status, _) = s
                .post_json("/v1/completions", &json!({"prompt": ids(600)}))
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            "too long"
        }
        6 => {
            let mut resp = s.post("/v1/completions", &stream(300)).await;
            assert_eq!(resp.status(), StatusCode::OK);
            resp.chunk().await.unwrap().expect("a first event");
            "left mid-stream"
        }
        7 => {
            let mut resp = s.post("/v1/completions", &stream(6)).await;
            let mut body = String::new();
            while let Some(bytes) = resp.chunk().await.unwrap() {
                body.push_str(std::str::from_utf8(&bytes).unwrap());
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
            "slow reader"
        }
        8 => {
            let (status, _) = s
                .post_json(
                    "/v1/completions",
                    &json!({"prompt": "a", "temperature": "hot"}),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            "bad field"
        }
        _ => {
            let body = json!({"prompt": ids(20), "max_tokens": 8, "temperature": 0});
            let (status, v) = s.post_json("/v1/completions", &body).await;
            assert_eq!(status, StatusCode::OK, "{v}");
            "whole"
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_mixed_requests_then_a_drain() {
    let options = ServeOptions {
        access_log: AccessLog::off(),
        ..ServeOptions::default()
    };
    // A pool small enough that the first wave's prompts and the prefix cache touch all of it:
    // what RSS gains after that is the server's, not pages the kernel hands out on first use.
    let config = Config {
        num_kvcache_blocks: 256,
        ..config()
    };
    let (s, stop, serving) = start_stoppable(config, options).await;
    let mut parts = Vec::new();
    for (kind, from, n) in [("system", 0, 12), ("context", 12, 20), ("query", 32, 6)] {
        let body = json!({"chunk_type": kind, "token_ids": ids(from + n)[from..].to_vec()});
        let (status, v) = s.post_json("/v1/chunks", &body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        parts.push(v["id"].clone());
    }
    let chunks = json!({"system_id": parts[0], "context_ids": [parts[1]], "query_id": parts[2]});

    let per_wave = REQUESTS / WAVES;
    let mut answered = 0;
    let mut first_rss = 0;
    let soak = async {
        for wave in 0..WAVES {
            let done: Vec<&str> = stream::iter(wave * per_wave..(wave + 1) * per_wave)
                .map(|i| one(&s, i, &chunks))
                .buffer_unordered(AT_ONCE)
                .collect()
                .await;
            answered += done.len();
            let m = s.idle_metrics().await;
            assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0, "wave {wave}");
            eprintln!("wave {wave}: RSS {} KiB", rss_kib());
            if wave == 0 {
                first_rss = rss_kib();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(150), soak)
        .await
        .expect("the soak ran past 150 s");
    assert_eq!(answered, REQUESTS);
    let last_rss = rss_kib();
    assert!(
        last_rss as f64 <= first_rss as f64 * 1.10,
        "RSS grew from {first_rss} KiB after the first wave to {last_rss} KiB"
    );
    let m = s.metrics().await;
    assert_eq!(
        m.get("nano_requests_finished_total{reason=\"abort\"}"),
        (REQUESTS / 10 / WAVES * WAVES) as f64
    );

    // The drain: streams in flight finish, then the server stops.
    let long = json!({"prompt": "ROMEO:", "max_tokens": 40, "ignore_eos": true, "stream": true});
    let streams: Vec<_> = (0..4).map(|_| s.post("/v1/completions", &long)).collect();
    let mut responses = Vec::new();
    for r in streams {
        let mut resp = r.await;
        assert_eq!(resp.status(), StatusCode::OK);
        let first = resp.chunk().await.unwrap().expect("a first event");
        responses.push((first, resp));
    }
    stop.send(()).unwrap();
    for (first, resp) in responses {
        let rest = read_events_after(first, resp).await;
        assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
    }
    let drained = tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .expect("the drain ended")
        .unwrap()
        .unwrap();
    assert_eq!(drained, Drained::InTime);
}

async fn read_events_after(first: axum::body::Bytes, mut resp: reqwest::Response) -> String {
    let mut text = String::from_utf8(first.to_vec()).unwrap();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    text
}
