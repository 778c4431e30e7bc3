//! A client that sends half a request is not waited for: the connection closes after the
//! header timeout, and a body that does not come gets a 408 after the body timeout.

use std::time::{Duration, Instant};

use phase6_server::{Limits, ServeOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::start;

/// Reads until the server closes the connection (bounded); returns what it sent and when.
async fn read_until_closed(conn: &mut TcpStream) -> (String, Duration) {
    let start = Instant::now();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer))
        .await
        .expect("the server closed the connection")
        .unwrap();
    (
        String::from_utf8_lossy(&answer).into_owned(),
        start.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_not_waited_for() {
    let s = start(ServeOptions {
        body_timeout: Duration::from_secs(1),
        limits: Limits {
            header_timeout: Duration::from_secs(1),
            ..Limits::default()
        },
        ..ServeOptions::default()
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_string();

    let mut headers_only = Vec::new();
    for _ in 0..8 {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        headers_only.push(c);
    }
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    for c in &mut headers_only {
        let (_, after) = read_until_closed(c).await;
        assert!(after < Duration::from_secs(5), "closed after {after:?}");
    }
    let (answer, _) = read_until_closed(&mut idle).await;
    assert!(answer.is_empty(), "{answer}");

    let mut no_body = TcpStream::connect(&addr).await.unwrap();
    no_body
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\nConnection: close\r\n\r\n{\"prompt\": ",
        )
        .await
        .unwrap();
    let (answer, after) = read_until_closed(&mut no_body).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("invalid_request_error"), "{answer}");
    assert!(after < Duration::from_secs(5), "answered after {after:?}");

    let (status, _) = s.get_json("/v1/models").await;
    assert_eq!(status, 200);
}
