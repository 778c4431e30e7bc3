//! One access-log line per request: method, path, status, request id, prompt and completion
//! tokens, elapsed time; a stream's line comes once the stream has ended.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use phase6_server::{AccessLog, ServeOptions};
use serde_json::json;

use crate::harness::{read_events, start};

/// A writer the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_string).collect()
    }

    /// Waits for the `n`th line (a stream's is written just after its last event).
    async fn wait_for(&self, n: usize) -> Vec<String> {
        for _ in 0..200 {
            let lines = self.lines();
            if lines.len() >= n {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("only {:?} after 5 s", self.lines());
    }
}

/// The line with its time masked.
fn masked(line: &str) -> String {
    let (head, time) = line.rsplit_once(" elapsed=").expect("an elapsed field");
    let secs: f64 = time.strip_suffix('s').unwrap().parse().unwrap();
    assert!((0.0..60.0).contains(&secs), "{line}");
    format!("{head} elapsed=<secs>")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_line() {
    let log = Captured::default();
    let s = start(ServeOptions {
        access_log: AccessLog::to_writer(log.clone()),
        ..ServeOptions::default()
    })
    .await;
    let post = |path: &str, body: serde_json::Value, id: &str| {
        s.client
            .post(s.url(path))
            .header("x-request-id", id)
            .json(&body)
            .send()
    };
    let whole = json!({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    assert_eq!(
        post("/v1/completions", whole, "whole-1")
            .await
            .unwrap()
            .status(),
        200
    );
    log.wait_for(1).await;

    let streamed = json!({
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": true,
        "stream": true,
    });
    let resp = post("/v1/chat/completions", streamed, "stream-2")
        .await
        .unwrap();
    read_events(resp).await;
    log.wait_for(2).await;

    let bad = json!({"prompt": "x", "temperature": "hot"});
    assert_eq!(
        post("/v1/completions", bad, "bad-3")
            .await
            .unwrap()
            .status(),
        400
    );
    log.wait_for(3).await;
    let resp = s.client.get(s.url("/nowhere")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let lines = log.wait_for(4).await;

    assert_eq!(lines.len(), 4, "{lines:?}");
    let masked: Vec<String> = lines.iter().map(|l| masked(l)).collect();
    // The generated id of the last line differs per run: only its form is kept.
    let last = masked[3].clone();
    let (before, after) = last.split_once("request_id=").unwrap();
    let id_end = after.find(' ').unwrap();
    assert!(after.starts_with("req-"), "{last}");
    let masked_last = format!("{before}request_id=<generated>{}", &after[id_end..]);
    let shown = [&masked[0], &masked[1], &masked[2], &masked_last]
        .map(String::as_str)
        .join("\n");
    insta::assert_snapshot!(shown);
}
