//! The OpenAI endpoints answer in OpenAI's shapes: completions and chat, whole and streamed
//! (the same text either way), usage counts, stop strings and stop tokens, seeds, and the
//! model list, health and metrics.

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{assert_error, start_default, stream_text};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_whole_and_streamed_agree() {
    let s = start_default().await;
    let body = json!({
        "model": "tiny-shakespeare",
        "prompt": "ROMEO:\n",
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": true,
        "return_token_ids": true,
    });
    let (status, whole) = s.post_json("/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["model"], "tiny-shakespeare");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), 6);
    let usage = &whole["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 6)
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/completions", &streamed).await;
    let (text, ids, finish) = stream_text(&events);
    assert_eq!(text, choice["text"].as_str().unwrap());
    assert_eq!(json!(ids), choice["token_ids"]);
    assert_eq!(finish, "length");
    let last = events.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], *usage);
    assert!(events.iter().all(|e| e["id"] == events[0]["id"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_whole_and_streamed_agree() {
    let s = start_default().await;
    let body = json!({
        "model": "tiny-shakespeare",
        "messages": [
            {"role": "system", "content": "Speak as a Veronese."},
            {"role": "user", "content": "Who goes there?"},
        ],
        "max_tokens": 8,
        "temperature": 0,
    });
    let (status, whole) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let completion_tokens = whole["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=8).contains(&completion_tokens));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = s.stream("/v1/chat/completions", &streamed).await;
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let (text, _, finish) = stream_text(&events);
    assert_eq!(text, message["content"].as_str().unwrap());
    assert_eq!(
        finish,
        whole["choices"][0]["finish_reason"].as_str().unwrap()
    );
    assert!(events.iter().all(|e| e.get("usage").is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_stop_tokens_and_seeds() {
    let s = start_default().await;
    let greedy = |extra: serde_json::Value| {
        let mut body = json!({
            "prompt": "JULIET:\n",
            "max_tokens": 24,
            "temperature": 0,
            "ignore_eos": true,
            "return_token_ids": true,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let (_, full) = s.post_json("/v1/completions", &greedy(json!({}))).await;
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let ids = full["choices"][0]["token_ids"].as_array().unwrap().clone();

    // A stop string from the middle of the text: the answer ends just before it, streamed or not.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let before = &text[..text.find(&stop).unwrap()];
    let (_, cut) = s
        .post_json("/v1/completions", &greedy(json!({"stop": [stop.clone()]})))
        .await;
    assert_eq!(cut["choices"][0]["text"], before, "stop {stop:?}");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    let events = s
        .stream(
            "/v1/completions",
            &greedy(json!({"stop": stop, "stream": true})),
        )
        .await;
    let (streamed, _, finish) = stream_text(&events);
    assert_eq!((streamed.as_str(), finish.as_str()), (before, "stop"));

    // A stop token: the output ends with it.
    let (_, cut) = s
        .post_json(
            "/v1/completions",
            &greedy(json!({"stop_token_ids": [ids[3]]})),
        )
        .await;
    let first = ids.iter().position(|t| *t == ids[3]).unwrap();
    assert_eq!(cut["choices"][0]["token_ids"], json!(ids[..=first]));
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");

    // Sampling with a seed repeats itself.
    let sampled = json!({"prompt": "KING:", "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 7});
    let (_, a) = s.post_json("/v1/completions", &sampled).await;
    let (_, b) = s.post_json("/v1/completions", &sampled).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_and_metrics() {
    let s = start_default().await;
    let (status, models) = s.get_json("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny-shakespeare");
    assert_eq!(models["data"][0]["object"], "model");
    let (status, one) = s.get_json("/v1/models/tiny-shakespeare").await;
    assert_eq!((status, &one), (StatusCode::OK, &models["data"][0]));
    let (status, missing) = s.get_json("/v1/models/gpt-4").await;
    assert_error(status, &missing, StatusCode::NOT_FOUND, Some("model"));
    assert_eq!(missing["error"]["code"], "model_not_found");
    let (status, health) = s.get_json("/health").await;
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));

    let (status, _) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "ROMEO:", "max_tokens": 4, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let m = s.idle_metrics().await;
    assert_eq!(m.get("nano_generation_tokens_total"), 4.0);
    assert_eq!(
        m.get("nano_requests_finished_total{reason=\"length\"}"),
        1.0
    );
    assert!(m.get("nano_kv_pages_total") > 0.0);
    assert!(m.get("nano_generation_tokens_per_second") > 0.0);
    assert!((0.0..=1.0).contains(&m.get("nano_prefix_cache_hit_rate")));
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);
    assert!(m.0.contains("# TYPE nano_requests_running gauge"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_a_request_id() {
    let s = start_default().await;
    let given = s
        .client
        .get(s.url("/v1/models"))
        .header("x-request-id", "trace-42")
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "trace-42");
    let mut made = Vec::new();
    for path in ["/health", "/no/such/path"] {
        let resp = s.client.get(s.url(path)).send().await.unwrap();
        let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(id.starts_with("req-"), "{id}");
        made.push(id);
    }
    assert_ne!(made[0], made[1], "each request gets its own id");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_agree_with_generation() {
    let s = start_default().await;
    let (status, t) = s.post_json("/tokenize", &json!({"prompt": "ROMEO:"})).await;
    assert_eq!(status, StatusCode::OK);
    let count = t["count"].as_u64().unwrap();
    assert_eq!(t["tokens"].as_array().unwrap().len() as u64, count);
    let (_, done) = s
        .post_json(
            "/v1/completions",
            &json!({"prompt": "ROMEO:", "max_tokens": 1}),
        )
        .await;
    assert_eq!(done["usage"]["prompt_tokens"].as_u64(), Some(count));
    let (status, d) = s
        .post_json("/detokenize", &json!({"tokens": t["tokens"]}))
        .await;
    assert_eq!(
        (status, d["prompt"].as_str()),
        (StatusCode::OK, Some("ROMEO:"))
    );

    let messages = json!([{"role": "user", "content": "Who art thou?"}]);
    let (_, chat) = s
        .post_json("/tokenize", &json!({"messages": messages}))
        .await;
    let (_, answer) = s
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 1}),
        )
        .await;
    assert_eq!(chat["count"], answer["usage"]["prompt_tokens"]);

    let (status, bad) = s
        .post_json("/detokenize", &json!({"tokens": [999_999]}))
        .await;
    assert_error(status, &bad, StatusCode::BAD_REQUEST, Some("tokens"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_access_only_for_the_origins_allowed() {
    let page = "http://page.test";
    let preflight = |s: &crate::harness::TestServer, origin: &str| {
        s.client
            .request(reqwest::Method::OPTIONS, s.url("/v1/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send()
    };
    // By default no origin is allowed: no preflight succeeds, no answer names an origin.
    let s = start_default().await;
    let resp = preflight(&s, page).await.unwrap();
    assert_ne!(resp.status(), StatusCode::NO_CONTENT);
    assert!(resp.headers().get("access-control-allow-origin").is_none());

    let s = crate::harness::start(phase6_server::ServeOptions {
        allowed_origins: vec![page.into()],
        ..phase6_server::ServeOptions::default()
    })
    .await;
    let resp = preflight(&s, page).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert_eq!(resp.headers()["access-control-allow-origin"], page);
    assert!(
        resp.headers()["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("content-type")
    );
    let answer = s
        .client
        .get(s.url("/v1/models"))
        .header("origin", page)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()["access-control-allow-origin"], page);
    let other = preflight(&s, "http://elsewhere.test").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none());
}
