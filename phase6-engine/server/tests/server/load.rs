//! A bounded load test: 64 concurrent streaming clients, each sending a few greedy requests
//! one after another. Every request must come back whole, with exactly the tokens the engine
//! gives for its prompt alone, none lost, and no page left held afterwards. It prints
//! requests/s and the p50/p99 latency of a request (send to `[DONE]`).

use std::time::{Duration, Instant};

use phase6::{LLM, SamplingParams};
use serde_json::json;

use crate::harness::{config, start_default, stream_text};

const CLIENTS: usize = 64;
const REQUESTS_PER_CLIENT: usize = 4;
const MAX_TOKENS: usize = 16;

const PROMPTS: [&str; 12] = [
    "ROMEO:\n",
    "JULIET:\nAy me!",
    "KING RICHARD III:\nNow is the winter of our discontent",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "MENENIUS:\n",
    "Good morrow, cousin.",
    "HAMLET:\nTo be, or not to be",
    "O, she doth teach the torches to burn bright!",
    "NURSE:\nFaith, I can tell her age unto an hour.",
    "What light through yonder window breaks?",
    "BENVOLIO:\nHere comes the furious Tybalt back again.",
    "A plague o' both your houses!",
];

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_streaming_clients_get_the_tokens_of_each_prompt_alone() {
    // What the engine gives for each prompt on its own.
    let expected: Vec<Vec<u64>> = tokio::task::spawn_blocking(|| {
        let mut llm = LLM::new(phase6::default_model_dir(), config()).unwrap();
        let params = SamplingParams::greedy().with_max_tokens(MAX_TOKENS);
        PROMPTS
            .iter()
            .map(|p| {
                let out = llm.generate(&[*p], params.clone(), false).unwrap();
                out[0].token_ids.iter().map(|&t| t as u64).collect()
            })
            .collect()
    })
    .await
    .unwrap();

    let s = start_default().await;
    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (client, url) = (s.client.clone(), s.url("/v1/completions"));
        clients.push(tokio::spawn(async move {
            let mut results = Vec::new();
            for r in 0..REQUESTS_PER_CLIENT {
                let prompt = (c * REQUESTS_PER_CLIENT + r) % PROMPTS.len();
                let body = json!({
                    "prompt": PROMPTS[prompt],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "stream": true,
                    "return_token_ids": true,
                });
                let sent = Instant::now();
                let resp = client.post(&url).json(&body).send().await.unwrap();
                assert!(resp.status().is_success(), "{}", resp.status());
                let events = crate::harness::read_events(resp).await;
                let (_, ids, finish) = stream_text(&events);
                results.push((prompt, ids, finish, sent.elapsed()));
            }
            results
        }));
    }
    let mut latencies = Vec::new();
    let bounded = tokio::time::timeout(Duration::from_secs(300), async {
        for client in clients {
            for (prompt, ids, finish, latency) in client.await.unwrap() {
                assert_eq!(ids, expected[prompt], "prompt {prompt}");
                assert!(finish == "length" || finish == "stop");
                latencies.push(latency);
            }
        }
    })
    .await;
    assert!(bounded.is_ok(), "the load test did not finish in 300 s");
    let elapsed = started.elapsed();
    assert_eq!(
        latencies.len(),
        CLIENTS * REQUESTS_PER_CLIENT,
        "requests lost"
    );
    latencies.sort();
    println!(
        "load: {} clients x {} streaming requests ({} tokens each) in {:.2} s: {:.1} requests/s, latency p50 {} ms, p99 {} ms",
        CLIENTS,
        REQUESTS_PER_CLIENT,
        MAX_TOKENS,
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.50).as_millis(),
        percentile(&latencies, 0.99).as_millis(),
    );

    let m = s.idle_metrics().await;
    assert_eq!(m.get("nano_kv_page_holds_requests"), 0.0);
    let finished = m.get("nano_requests_finished_total{reason=\"stop\"}")
        + m.get("nano_requests_finished_total{reason=\"length\"}");
    assert_eq!(finished as usize, CLIENTS * REQUESTS_PER_CLIENT);
    assert_eq!(m.get("nano_requests_finished_total{reason=\"abort\"}"), 0.0);
}
