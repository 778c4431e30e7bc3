//! `n` choices, lists of prompts, log-probabilities and `echo`, streamed and not: indexes as
//! OpenAI numbers them (prompt i, choice j -> i * n + j), usage summed over choices, seeded
//! choices reproducible one by one, log-probabilities in each endpoint's shape.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{TestServer, start_default};

async fn ok(s: &TestServer, path: &str, body: Value) -> Value {
    let (status, v) = s.post_json(path, &body).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

fn texts(v: &Value) -> Vec<String> {
    let choices = v["choices"].as_array().unwrap();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
    }
    choices
        .iter()
        .map(|c| {
            c["text"]
                .as_str()
                .or(c["message"]["content"].as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Per index: the text of a stream, its finish reasons and its chunks' log-probabilities.
fn by_index(events: &[Value]) -> BTreeMap<u64, (String, Vec<String>, Vec<Value>)> {
    let mut out: BTreeMap<u64, (String, Vec<String>, Vec<Value>)> = BTreeMap::new();
    for e in events {
        for c in e["choices"].as_array().unwrap_or_else(|| panic!("{e}")) {
            let slot = out.entry(c["index"].as_u64().unwrap()).or_default();
            let piece = c["text"].as_str().or(c["delta"]["content"].as_str());
            slot.0.push_str(piece.unwrap_or_default());
            if let Some(f) = c["finish_reason"].as_str() {
                slot.1.push(f.to_string());
            }
            if !c["logprobs"].is_null() {
                slot.2.push(c["logprobs"].clone());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_and_prompt_lists() {
    let s = start_default().await;
    let greedy =
        json!({"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "n": 3});
    let v = ok(&s, "/v1/completions", greedy.clone()).await;
    let t = texts(&v);
    assert_eq!(t.len(), 3);
    assert!(
        t.iter().all(|x| *x == t[0]),
        "greedy choices are equal: {t:?}"
    );
    assert_eq!(v["usage"]["completion_tokens"], 18);
    let one = ok(
        &s,
        "/v1/completions",
        json!({"prompt": "ROMEO:", "max_tokens": 1}),
    )
    .await;
    assert_eq!(v["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);

    // Seeded: choice j is the single request seeded seed + j.
    let sampled = json!({"prompt": "ROMEO:", "max_tokens": 8, "temperature": 1, "seed": 40, "ignore_eos": true, "n": 3});
    let t = texts(&ok(&s, "/v1/completions", sampled.clone()).await);
    for (j, text) in t.iter().enumerate() {
        let mut alone = sampled.clone();
        alone["n"] = json!(1);
        alone["seed"] = json!(40 + j);
        assert_eq!(texts(&ok(&s, "/v1/completions", alone).await)[0], *text);
    }
    assert!(t[0] != t[1] || t[1] != t[2], "seeds 40..43 all gave {t:?}");

    // Streamed, the same choices by index, each finished once, usage summed.
    let mut streamed = sampled.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = s.stream("/v1/completions", &streamed).await;
    let got = by_index(&events);
    assert_eq!(got.len(), 3);
    for (i, (text, finish, _)) in &got {
        assert_eq!(*text, t[*i as usize]);
        assert_eq!(*finish, vec!["length"]);
    }
    assert_eq!(events.last().unwrap()["usage"]["completion_tokens"], 24);

    // A list of prompts (text and token ids), two choices each: index i * n + j.
    let list = json!({"prompt": ["ROMEO:", [5, 9, 30]], "max_tokens": 4, "temperature": 0, "ignore_eos": true, "n": 2});
    let v = ok(&s, "/v1/completions", list).await;
    let t = texts(&v);
    assert_eq!(t.len(), 4);
    assert_eq!((&t[0], &t[2]), (&t[1], &t[3]));
    let second = ok(
        &s,
        "/v1/completions",
        json!({"prompt": [5, 9, 30], "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(t[2], texts(&second)[0]);
    let prompt_tokens = one["usage"]["prompt_tokens"].as_u64().unwrap() + 3;
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 16);

    // Chat: n choices streamed, each announced with its role.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0, "ignore_eos": true, "n": 2, "stream": true});
    let events = s.stream("/v1/chat/completions", &chat).await;
    let roles = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"] == "assistant")
        .count();
    assert_eq!(roles, 2);
    let got = by_index(&events);
    assert_eq!(got[&0].0, got[&1].0);
    let m = s.idle_metrics().await;
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_and_echo() {
    let s = start_default().await;
    let body = json!({"prompt": "ROMEO:", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 2});
    let v = ok(&s, "/v1/completions", body.clone()).await;
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6, "{lp}");
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, v["choices"][0]["text"]);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!((2..=3).contains(&top.len()), "{top:?}");
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let best = top
            .values()
            .map(|p| p.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(
            (best - chosen).abs() < 1e-6,
            "greedy picks the most likely: {top:?} {chosen}"
        );
    }
    // Streamed: the same entries, a chunk at a time.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let got = by_index(&s.stream("/v1/completions", &streamed).await);
    let chunks = &got[&0].2;
    let streamed_lps: Vec<Value> = chunks
        .iter()
        .flat_map(|c| c["token_logprobs"].as_array().unwrap().clone())
        .collect();
    assert_eq!(&streamed_lps, lp["token_logprobs"].as_array().unwrap());

    // Chat: logprobs true with three alternatives, streamed and not.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 3});
    let v = ok(&s, "/v1/chat/completions", chat.clone()).await;
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], entry["token"], "{entry}");
        assert_eq!(
            entry["bytes"].as_array().unwrap().len(),
            entry["token"].as_str().unwrap().len()
        );
    }
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let got = by_index(&s.stream("/v1/chat/completions", &streamed).await);
    let entries: Vec<Value> = got[&0]
        .2
        .iter()
        .flat_map(|c| c["content"].as_array().unwrap().clone())
        .collect();
    assert_eq!(&entries, content);
    // Without logprobs, none.
    let plain = ok(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    )
    .await;
    assert!(plain["choices"][0]["logprobs"].is_null());

    // echo: the prompt starts each choice's text, streamed as its first chunk.
    let echo = json!({"prompt": ["ROMEO:", "JULIET:"], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "echo": true});
    let v = ok(&s, "/v1/completions", echo.clone()).await;
    let t = texts(&v);
    assert!(t[0].starts_with("ROMEO:") && t[0].len() > 6, "{t:?}");
    assert!(t[1].starts_with("JULIET:"), "{t:?}");
    let mut streamed = echo.clone();
    streamed["stream"] = json!(true);
    let events = s.stream("/v1/completions", &streamed).await;
    assert_eq!(events[0]["choices"][0]["text"], "ROMEO:");
    let got = by_index(&events);
    assert_eq!((&got[&0].0, &got[&1].0), (&t[0], &t[1]));
}
