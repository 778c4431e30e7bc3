//! A server on a free loopback port with the embedded model, and the client side of the
//! protocol: JSON calls, server-sent events, the Prometheus text of `/metrics`.

use std::time::Duration;

use phase6::{Config, Device};
use phase6_chunks::cpu_chunk_llm;
use phase6_server::{Drained, EngineHandle, ServeOptions, Server};
use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The engine settings of every test server: CPU, small pages, a short context so that an
/// over-long prompt is cheap to send.
pub fn config() -> Config {
    Config {
        device: Device::Cpu,
        kvcache_block_size: 16,
        cpu_kv_cache_bytes: 64 << 20,
        max_model_len: 512,
        seed: Some(0),
        ..Config::default()
    }
}

pub struct TestServer {
    pub base: String,
    pub client: Client,
}

/// Starts a server on the current runtime; it stops when the test's runtime ends.
pub async fn start(options: ServeOptions) -> TestServer {
    start_on(config(), options).await
}

/// A server whose KV pool has only `blocks` pages.
pub async fn start_with_blocks(blocks: i64, options: ServeOptions) -> TestServer {
    let config = Config {
        num_kvcache_blocks: blocks,
        ..config()
    };
    start_on(config, options).await
}

/// A server over the engine settings given.
pub async fn start_on(config: Config, options: ServeOptions) -> TestServer {
    let (server, _, _) = start_stoppable(config, options).await;
    server
}

/// A server that drains and stops, as at SIGTERM, when the sender fires (dropping it stops
/// nothing); the task ends once it has.
pub async fn start_stoppable(
    config: Config,
    options: ServeOptions,
) -> (
    TestServer,
    oneshot::Sender<()>,
    JoinHandle<std::io::Result<Drained>>,
) {
    let engine = tokio::task::spawn_blocking(move || {
        EngineHandle::spawn(move || cpu_chunk_llm(phase6::default_model_dir(), config))
    })
    .await
    .unwrap()
    .unwrap();
    let server = Server::bind("127.0.0.1:0", engine, options).await.unwrap();
    let base = format!("http://{}", server.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(server.run_until(async move {
        if stopped.await.is_ok() {
            return;
        }
        std::future::pending::<()>().await
    }));
    let server = TestServer {
        base,
        client: Client::new(),
    };
    (server, stop, serving)
}

pub async fn start_default() -> TestServer {
    start(ServeOptions::default()).await
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// POSTs and returns the status and the JSON body.
    pub async fn post_json(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self.post(path, body).await;
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }

    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let resp = self.client.get(self.url(path)).send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap())
    }

    /// A streaming request, read to its end: the JSON events, checked to end with `[DONE]`.
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let resp = self.post(path, body).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert_eq!(content_type, "text/event-stream");
        read_events(resp).await
    }

    pub async fn metrics(&self) -> Metrics {
        let resp = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        Metrics(resp.text().await.unwrap())
    }

    /// Waits until no request runs or waits, and returns the metrics then.
    pub async fn idle_metrics(&self) -> Metrics {
        for _ in 0..600 {
            let m = self.metrics().await;
            if m.get("nano_requests_running") == 0.0 && m.get("nano_requests_waiting") == 0.0 {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the server did not go idle: {}", self.metrics().await.0);
    }
}

/// Reads `data:` events to the end of the body; the last one must be `[DONE]`.
pub async fn read_events(mut resp: Response) -> Vec<Value> {
    let mut buffer = String::new();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        buffer.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    let mut events: Vec<&str> = buffer
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .expect("every event is a data line")
        })
        .collect();
    assert_eq!(events.pop(), Some("[DONE]"), "{buffer}");
    events
        .into_iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// The text and token ids of a completion stream (with `return_token_ids`), and its finish.
pub fn stream_text(events: &[Value]) -> (String, Vec<u64>, String) {
    let (mut text, mut ids, mut finish) = (String::new(), Vec::new(), String::new());
    for e in events {
        for choice in e["choices"].as_array().unwrap() {
            let piece = choice["text"]
                .as_str()
                .or_else(|| choice["delta"]["content"].as_str())
                .unwrap_or_default();
            text.push_str(piece);
            if let Some(t) = choice["token_ids"].as_array() {
                ids.extend(t.iter().map(|v| v.as_u64().unwrap()));
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
    }
    (text, ids, finish)
}

/// The Prometheus text of `/metrics`.
pub struct Metrics(pub String);

impl Metrics {
    /// The value of a sample, by its name with labels (`name{label="x"}`).
    pub fn get(&self, sample: &str) -> f64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no sample {sample} in\n{}", self.0))
            .parse()
            .unwrap()
    }
}

/// The error of an OpenAI-shaped error body, checked to have every field.
pub fn error_of(body: &Value) -> &Value {
    let e = &body["error"];
    for field in ["message", "type", "param", "code"] {
        assert!(e.get(field).is_some(), "no error.{field} in {body}");
    }
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    e
}

/// Asserts a 4xx status and the field the error names; returns the message.
pub fn assert_error(
    status: StatusCode,
    body: &Value,
    want: StatusCode,
    param: Option<&str>,
) -> String {
    assert_eq!(status, want, "{body}");
    let e = error_of(body);
    assert_eq!(e["param"].as_str(), param, "{body}");
    e["message"].as_str().unwrap().to_string()
}
