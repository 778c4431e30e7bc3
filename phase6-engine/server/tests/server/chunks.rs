//! The chunk endpoints: register (text or token ids, with metadata), list with filters, read,
//! generate from a composition (whole and streamed, equal to plain generation of the same
//! tokens), stats, delete, and unknown or misplaced chunk ids named in the error.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestServer, assert_error, start_default, stream_text};

async fn register(s: &TestServer, body: Value) -> Value {
    let (status, chunk) = s.post_json("/v1/chunks", &body).await;
    assert_eq!(status, StatusCode::OK, "{chunk}");
    assert_eq!(chunk["object"], "chunk");
    chunk
}

fn ids(range: std::ops::Range<u64>) -> Vec<u64> {
    range.map(|i| 5 + i * 7 % 1900).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_register_list_generate_and_delete() {
    let s = start_default().await;
    let (system, ctx_a, ctx_b, query) = (ids(0..20), ids(20..45), ids(45..60), ids(60..66));
    let sys = register(&s, json!({"chunk_type": "system", "token_ids": system})).await;
    let a = register(
        &s,
        json!({"chunk_type": "context", "token_ids": ctx_a, "metadata": {"source": "act1"}}),
    )
    .await;
    let b = register(
        &s,
        json!({"chunk_type": "context", "token_ids": ctx_b, "metadata": {"source": "act2"}}),
    )
    .await;
    let q = register(&s, json!({"chunk_type": "query", "token_ids": query})).await;
    let text = register(
        &s,
        json!({"chunk_type": "context", "content": "Two households, both alike in dignity,", "metadata": {"source": "prologue"}}),
    )
    .await;
    assert_eq!(a["token_count"], 25);
    // Text is tokenized on the request's task, as /tokenize does it.
    let (_, counted) = s
        .post_json(
            "/tokenize",
            &json!({"prompt": "Two households, both alike in dignity,"}),
        )
        .await;
    assert_eq!(text["token_count"], counted["count"]);
    assert_eq!(a["metadata"], json!({"source": "act1"}));
    // The same content again is the same chunk.
    let again = register(&s, json!({"chunk_type": "query", "token_ids": query})).await;
    assert_eq!(again["id"], q["id"]);

    let list = |query: &'static str| {
        let s = &s;
        async move {
            let (status, list) = s.get_json(&format!("/v1/chunks{query}")).await;
            assert_eq!(status, StatusCode::OK, "{list}");
            let mut ids: Vec<String> = list["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(list("").await.len(), 5);
    assert_eq!(list("?type=context").await.len(), 3);
    assert_eq!(
        list("?type=context&metadata.source=act2").await,
        vec![b["id"].as_str().unwrap().to_string()]
    );
    let (status, one) = s
        .get_json(&format!("/v1/chunks/{}", text["id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["content"], "Two households, both alike in dignity,");

    // Generation from the composition equals plain generation of the same tokens.
    let composed = json!({
        "system_id": sys["id"],
        "context_ids": [a["id"], b["id"]],
        "query_id": q["id"],
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": true,
        "return_token_ids": true,
    });
    let (status, out) = s.post_json("/v1/chunks/generate", &composed).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let prompt: Vec<u64> = [system, ctx_a, ctx_b, query].concat();
    let (_, plain) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "return_token_ids": true}),
        )
        .await;
    assert_eq!(
        out["choices"][0]["token_ids"],
        plain["choices"][0]["token_ids"]
    );
    assert_eq!(out["choices"][0]["text"], plain["choices"][0]["text"]);
    assert_eq!(out["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(
        out["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt.len() - 6
    );
    let mut streamed = composed.clone();
    streamed["stream"] = json!(true);
    let (text_streamed, ids_streamed, finish) =
        stream_text(&s.stream("/v1/chunks/generate", &streamed).await);
    assert_eq!(json!(ids_streamed), out["choices"][0]["token_ids"]);
    assert_eq!(text_streamed, out["choices"][0]["text"].as_str().unwrap());
    assert_eq!(finish, "length");

    let (status, stats) = s.get_json("/v1/chunks/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stats["total_chunks"], 5);
    assert!(stats["cache_hits"].as_u64().unwrap() >= 2, "{stats}");
    let m = s.idle_metrics().await;
    assert!(m.get("nano_kv_pages_chunks") > 0.0);
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);

    // Deleting: gone from the store, a second delete and a read are 404.
    let path = format!("/v1/chunks/{}", b["id"].as_str().unwrap());
    let resp = s.client.delete(s.url(&path)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let deleted: Value = resp.json().await.unwrap();
    assert_eq!(deleted["deleted"], true);
    let resp = s.client.delete(s.url(&path)).send().await.unwrap();
    let status = resp.status();
    assert_error(
        status,
        &resp.json().await.unwrap(),
        StatusCode::NOT_FOUND,
        Some("id"),
    );
    let (status, body) = s.get_json(&path).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, Some("id"));
    let (status, body) = s.post_json("/v1/chunks/generate", &composed).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, Some("context_ids[1]"));
    assert_eq!(list("?type=context").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chunk_requests_name_their_field() {
    let s = start_default().await;
    let bad = StatusCode::BAD_REQUEST;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"content": "x"}), "chunk_type"),
        (
            json!({"chunk_type": "preface", "content": "x"}),
            "chunk_type",
        ),
        (json!({"chunk_type": "context"}), "content"),
        (
            json!({"chunk_type": "context", "content": "x", "token_ids": [1]}),
            "content",
        ),
        (json!({"chunk_type": "context", "content": ""}), "content"),
        (json!({"chunk_type": "context", "content": 3}), "content"),
        (
            json!({"chunk_type": "context", "token_ids": "1 2"}),
            "token_ids",
        ),
        (
            json!({"chunk_type": "context", "token_ids": [1, 1e9]}),
            "token_ids",
        ),
        (
            json!({"chunk_type": "context", "content": "x", "metadata": {"k": 1}}),
            "metadata.k",
        ),
        (
            json!({"chunk_type": "context", "content": "x", "metadata": []}),
            "metadata",
        ),
        (
            json!({"chunk_type": "context", "content": "ROMEO ".repeat(600)}),
            "content",
        ),
    ];
    for (body, param) in cases {
        let (status, answer) = s.post_json("/v1/chunks", &body).await;
        assert_error(status, &answer, bad, Some(param));
    }
    let (status, answer) = s.get_json("/v1/chunks?kind=context").await;
    assert_error(status, &answer, bad, Some("kind"));
    let (status, answer) = s.get_json("/v1/chunks?type=preface").await;
    assert_error(status, &answer, bad, Some("type"));

    let sys = register(
        &s,
        json!({"chunk_type": "system", "content": "You are the Chorus.\n"}),
    )
    .await;
    let q = register(&s, json!({"chunk_type": "query", "content": "ROMEO:\n"})).await;
    let generate = |system: &Value, contexts: Value, query: &Value| json!({"system_id": system, "context_ids": contexts, "query_id": query, "max_tokens": 2});
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            generate(&json!("nope"), json!([]), &q["id"]),
            StatusCode::NOT_FOUND,
            "system_id",
        ),
        (
            generate(&sys["id"], json!(["nope"]), &q["id"]),
            StatusCode::NOT_FOUND,
            "context_ids[0]",
        ),
        (
            generate(&sys["id"], json!([]), &json!("nope")),
            StatusCode::NOT_FOUND,
            "query_id",
        ),
        (generate(&q["id"], json!([]), &q["id"]), bad, "system_id"),
        (
            generate(&sys["id"], json!([sys["id"]]), &q["id"]),
            bad,
            "context_ids[0]",
        ),
        (
            generate(&sys["id"], json!("x"), &q["id"]),
            bad,
            "context_ids",
        ),
        (
            json!({"system_id": sys["id"], "query_id": q["id"], "top_p": 0}),
            bad,
            "top_p",
        ),
        (json!({"query_id": q["id"]}), bad, "system_id"),
    ];
    for (body, want, param) in cases {
        let (status, answer) = s.post_json("/v1/chunks/generate", &body).await;
        assert_error(status, &answer, want, Some(param));
    }
    // Contexts that fit one by one but not together (max_model_len is 512 here).
    let long_a = register(
        &s,
        json!({"chunk_type": "context", "token_ids": ids(0..300)}),
    )
    .await;
    let long_b = register(
        &s,
        json!({"chunk_type": "context", "token_ids": ids(300..600)}),
    )
    .await;
    let (status, answer) = s
        .post_json(
            "/v1/chunks/generate",
            &generate(&sys["id"], json!([long_a["id"], long_b["id"]]), &q["id"]),
        )
        .await;
    let message = assert_error(status, &answer, bad, Some("context_ids"));
    assert!(
        message.contains("maximum context length is 512"),
        "{message}"
    );
    let (status, answer) = s
        .post_json(
            "/v1/chunks/generate",
            &generate(&sys["id"], json!([long_a["id"]]), &q["id"]),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        s.idle_metrics().await.get("nano_kv_page_holds_requests"),
        0.0
    );
}
