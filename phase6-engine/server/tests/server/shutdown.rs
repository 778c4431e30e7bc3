//! Graceful shutdown: once the signal comes, the server accepts no new connection but answers
//! every request in flight to its end, then `run_until` returns.

use phase6_chunks::cpu_chunk_llm;
use phase6_server::{EngineHandle, ServeOptions, Server};
use reqwest::{Client, StatusCode};
use serde_json::json;

use crate::harness::{config, stream_text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_streams_in_flight_and_refuses_new_ones() {
    let engine = tokio::task::spawn_blocking(|| {
        EngineHandle::spawn(|| cpu_chunk_llm(phase6::default_model_dir(), config()))
    })
    .await
    .unwrap()
    .unwrap();
    let server = Server::bind("127.0.0.1:0", engine, ServeOptions::default())
        .await
        .unwrap();
    let url = format!("http://{}/v1/completions", server.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));

    let client = Client::new();
    let body = json!({
        "prompt": "ROMEO:\n",
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    });
    let mut resp = client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    // The first event proves the request is being generated; then the signal comes.
    let first = resp.chunk().await.unwrap().expect("a first event");
    stop.send(()).unwrap();

    let mut rest = String::from_utf8(first.to_vec()).unwrap();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        rest.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    let events: Vec<serde_json::Value> = rest
        .split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert!(
        rest.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {rest}"
    );
    let (_, _, finish) = stream_text(&events);
    assert_eq!(finish, "length", "the request in flight ran to its end");

    serving.await.unwrap().unwrap();
    let refused = client.post(&url).json(&body).send().await;
    assert!(refused.is_err(), "a stopped server still answered");
}
