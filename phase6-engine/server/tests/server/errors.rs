//! Bad input gets a 4xx in OpenAI's error shape naming the field, and nothing a client sends
//! stops the server: after every kind of bad request, and a few hundred mangled bodies, it
//! still answers.

use phase6_server::ServeOptions;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{assert_error, error_of, start, start_default};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_their_field() {
    let s = start(ServeOptions {
        max_body_bytes: 64 << 10,
        ..ServeOptions::default()
    })
    .await;
    let bad = StatusCode::BAD_REQUEST;
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": "hot"}),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": -1}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 0}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "temperature": -0.5}),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_p": 1.5}),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "top_k": 0}),
            Some("top_k"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "seed": "x"}),
            Some("seed"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "n": 17}),
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stop": [1]}),
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "stream": 1}),
            Some("stream"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "logprobs": 6}),
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": {"text": "a"}}),
            Some("prompt"),
        ),
        ("/v1/completions", json!({"prompt": ""}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": [1, 99999]}),
            Some("prompt"),
        ),
        ("/v1/completions", json!({"max_tokens": 3}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": "a", "model": 3}),
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}),
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "x"}]}),
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "n": 0}),
            Some("n"),
        ),
    ];
    for (path, body, param) in cases {
        let (status, answer) = s.post_json(path, &body).await;
        assert_error(status, &answer, bad, param);
    }

    // A prompt longer than max_model_len (512 tokens in these tests).
    let long = "ROMEO: ".repeat(400);
    let (status, answer) = s
        .post_json("/v1/completions", &json!({"prompt": long}))
        .await;
    let message = assert_error(status, &answer, bad, Some("prompt"));
    assert!(
        message.contains("maximum context length is 512"),
        "{message}"
    );
    assert_eq!(answer["error"]["code"], "context_length_exceeded");
    let (status, answer) = s
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_error(status, &answer, bad, Some("messages"));

    // An unknown model is a 404 naming the field.
    let (status, answer) = s
        .post_json("/v1/completions", &json!({"prompt": "a", "model": "gpt-9"}))
        .await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, Some("model"));

    // Bodies that are not JSON objects.
    for raw in ["{\"prompt\": ", "[1, 2]", "", "\u{0}\u{1}"] {
        let resp = s
            .client
            .post(s.url("/v1/completions"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap();
        assert_error(status, &answer, bad, None);
    }

    // A body over the limit.
    let huge = json!({"prompt": "x".repeat(100 << 10)});
    let (status, answer) = s.post_json("/v1/completions", &huge).await;
    let message = assert_error(status, &answer, StatusCode::PAYLOAD_TOO_LARGE, None);
    assert!(message.contains("65536"), "{message}");

    // Unknown paths and methods keep the shape.
    let (status, answer) = s.get_json("/v1/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    error_of(&answer);
    let resp = s.client.get(s.url("/v1/completions")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    error_of(&resp.json().await.unwrap());

    // And the server still serves.
    let (status, answer) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "ROMEO:", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        s.idle_metrics().await.get("nano_kv_page_holds_requests"),
        0.0
    );
}

/// A small xorshift generator: reproducible mangling without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mangled_bodies_never_crash_the_server() {
    let s = start_default().await;
    let seeds = [
        r#"{"prompt": "ROMEO:", "max_tokens": 2, "temperature": 0.5, "top_p": 0.9, "stop": ["\n"]}"#,
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true}"#,
        r#"{"chunk_type": "context", "content": "Verona", "metadata": {"k": "v"}}"#,
        r#"{"system_id": "a", "context_ids": ["b"], "query_id": "c", "max_tokens": 2}"#,
    ];
    let paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chunks",
        "/v1/chunks/generate",
    ];
    let noise = b"{}[]\":,0-9e.ntfl\\u\xff ";
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..240 {
        let k = i % seeds.len();
        let mut body = seeds[k].as_bytes().to_vec();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(body.len());
            match rng.below(3) {
                0 => body[at] = noise[rng.below(noise.len())],
                1 => {
                    body.remove(at);
                }
                _ => body.insert(at, noise[rng.below(noise.len())]),
            }
        }
        let resp = s
            .client
            .post(s.url(paths[k]))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(
            status.is_success() || status.is_client_error(),
            "{status} for {:?}: {text}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, _) = s.get_json("/health").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        s.idle_metrics().await.get("nano_kv_page_holds_requests"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_required_when_set() {
    let s = start(ServeOptions {
        api_key: Some("sesame".into()),
        ..ServeOptions::default()
    })
    .await;
    let call = |key: Option<&str>| {
        let mut req = s
            .client
            .post(s.url("/v1/completions"))
            .json(&json!({"prompt": "ROMEO:", "max_tokens": 1}));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        req.send()
    };
    for key in [None, Some("open")] {
        let resp = call(key).await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_error(status, &body, StatusCode::UNAUTHORIZED, None);
        assert_eq!(body["error"]["code"], "invalid_api_key");
    }
    assert_eq!(call(Some("sesame")).await.unwrap().status(), StatusCode::OK);
    // The scheme is case-insensitive (RFC 9110); the key is not.
    for (header, want) in [
        ("bearer sesame", StatusCode::OK),
        ("Bearer SESAME", StatusCode::UNAUTHORIZED),
        ("Basic sesame", StatusCode::UNAUTHORIZED),
    ] {
        let resp = s
            .client
            .get(s.url("/v1/models"))
            .header("authorization", header)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), want, "{header}");
    }
    for path in ["/metrics", "/v1/models", "/v1/chunks"] {
        let resp = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, _) = s.get_json("/health").await;
    assert_eq!(status, StatusCode::OK);
}
