//! A client that leaves aborts its request: streamed (the connection closes after a few
//! events) or not (the client gives up waiting). The engine stops computing it and its KV
//! pages come back: `/metrics` shows no page held by requests and one abort each.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::start_default;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_gets_its_request_aborted() {
    let s = start_default().await;
    let long = json!({
        "prompt": "ROMEO:\n",
        "max_tokens": 480,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    });
    let mut resp = s.post("/v1/completions", &long).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut received = 0;
    while received < 3 {
        let bytes = resp.chunk().await.unwrap().expect("the stream goes on");
        received += String::from_utf8_lossy(&bytes).matches("data: ").count();
    }
    let m = s.metrics().await;
    assert_eq!(m.get("nano_requests_running"), 1.0);
    assert!(m.get("nano_kv_page_holds_requests") > 0.0);
    drop(resp);

    let m = s.idle_metrics().await;
    assert_eq!(m.get("nano_requests_finished_total{reason=\"abort\"}"), 1.0);
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);
    assert!(
        m.get("nano_generation_tokens_total") < 480.0,
        "the request was not cut short:\n{}",
        m.0
    );

    // Not streamed: the client stops waiting.
    let mut whole = long.clone();
    whole["stream"] = json!(false);
    let gave_up = s
        .client
        .post(s.url("/v1/completions"))
        .json(&whole)
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(gave_up.unwrap_err().is_timeout());
    let m = s.idle_metrics().await;
    assert_eq!(m.get("nano_requests_finished_total{reason=\"abort\"}"), 2.0);
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);
    assert!(m.get("nano_generation_tokens_total") < 960.0);

    // The server goes on serving.
    let (status, _) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "ROMEO:", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}
