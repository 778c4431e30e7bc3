//! The served `max_model_len` (`--max-model-len`, here 32 tokens, far below the model's own)
//! bounds every path: a completion's prompt, its prompt with `max_tokens`, a default
//! `max_tokens` cut to the room left, a chat, a chunk registered and a composition of chunks;
//! `/tokenize` and `/v1/models` report it.

use phase6::Config;
use phase6_server::ServeOptions;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestServer, assert_error, config, start_on};

const MAX_LEN: usize = 32;

async fn start_small() -> TestServer {
    let config = Config {
        max_model_len: MAX_LEN,
        ..config()
    };
    start_on(config, ServeOptions::default()).await
}

fn ids(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| 5 + i * 7 % 1900).collect()
}

/// A 400 that names `param` and says the served limit.
fn too_long(status: StatusCode, body: &Value, param: &str) {
    let msg = assert_error(status, body, StatusCode::BAD_REQUEST, Some(param));
    assert!(
        msg.contains(&format!("maximum context length is {MAX_LEN}")),
        "{msg}"
    );
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_max_model_len_bounds_every_path() {
    let s = start_small().await;

    let (status, body) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": ids(MAX_LEN), "max_tokens": 1}),
        )
        .await;
    too_long(status, &body, "prompt");
    let (status, body) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": ids(20), "max_tokens": 13}),
        )
        .await;
    too_long(status, &body, "prompt");
    // Exactly full is fine; a default max_tokens (16) is cut to the 12 tokens left.
    let (status, body) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": ids(20), "max_tokens": 12, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 12);
    let (status, body) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": ids(20), "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 12);
    assert_eq!(body["choices"][0]["finish_reason"], "length");

    let long_chat = json!({"messages": [{"role": "user", "content": "x".repeat(200)}]});
    let (status, body) = s.post_json("/v1/chat/completions", &long_chat).await;
    too_long(status, &body, "messages");
    let short_chat = json!({"messages": [{"role": "user", "content": "Hi"}], "ignore_eos": true});
    let (status, body) = s.post_json("/v1/chat/completions", &short_chat).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let usage = &body["usage"];
    assert_eq!(
        usage["total_tokens"], MAX_LEN,
        "chat's default fills the context: {body}"
    );

    // A chunk as long as the context cannot be registered; chunks that fit alone but not
    // together cannot be composed.
    let (status, body) = s
        .post_json(
            "/v1/chunks",
            &json!({"chunk_type": "context", "token_ids": ids(MAX_LEN)}),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, Some("token_ids"));
    let chunk = |kind: &str, from: usize, n: usize| {
        let s = &s;
        let kind = kind.to_string();
        async move {
            let tokens: Vec<u64> = ids(from + n)[from..].to_vec();
            let (status, body) = s
                .post_json(
                    "/v1/chunks",
                    &json!({"chunk_type": kind, "token_ids": tokens}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body["id"].as_str().unwrap().to_string()
        }
    };
    let system = chunk("system", 0, 10).await;
    let context = chunk("context", 10, 15).await;
    let query = chunk("query", 25, 8).await;
    let composed = json!({
        "system_id": system, "context_ids": [context], "query_id": query, "max_tokens": 1,
    });
    let (status, body) = s.post_json("/v1/chunks/generate", &composed).await;
    too_long(status, &body, "context_ids");

    let (status, body) = s.post_json("/tokenize", &json!({"prompt": "Hello"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["max_model_len"], MAX_LEN);
    let (_, models) = s.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["max_model_len"], MAX_LEN);
}
